//! A small regular-expression engine for the `$regex` operator of conditional routing.
//!
//! Patterns come from client configs, so no pattern may make matching slow: a pattern is
//! compiled to a program for a Pike VM (Thompson's NFA simulation), which advances every live
//! thread in step, one character of the text at a time, and drops duplicate threads. Matching
//! takes O(text length × program size) time whatever the pattern; nothing backtracks, so
//! `(a*)*b` is as fast as `ab`. Patterns are capped at `MAX_PATTERN_CHARS` characters,
//! counted repetitions at `MAX_REPEAT` and programs at `MAX_PROGRAM` instructions.
//!
//! Syntax, over Unicode characters:
//! - literals; `.` (any character but `\n`); `^` and `$` (start and end of the whole text;
//!   there is no multi-line mode); `\b` and `\B` (word boundary and its negation);
//! - `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, each optionally followed by `?` (lazy). Only
//!   whether a pattern matches is computed, so lazy and greedy behave the same;
//! - `a|b`, groups `( )` and `(?: )` (both only group: there are no captures);
//! - classes `[abc]`, `[^a-z]`, with escapes inside;
//! - escapes `\d \w \s` and their negations `\D \W \S` (`\d` and `\w` are ASCII, `\s` is
//!   Unicode whitespace), `\n \t \r \f \v`, and `\` before any ASCII punctuation for itself;
//! - a leading `(?i)` makes the whole pattern case-insensitive (simple one-to-one case
//!   mappings).
//!
//! Anything else (backreferences, lookaround, named groups, other flags, unknown escapes) is a
//! compile error rather than a silent literal, so a pattern never means something unexpected.

use crate::memo::{self, Memo};
use std::cell::RefCell;
use std::rc::Rc;

/// Longer patterns are refused (in characters).
const MAX_PATTERN_CHARS: usize = 1000;
/// Largest count in `{m}`, `{m,}` and `{m,n}`.
const MAX_REPEAT: u32 = 100;
/// Largest compiled program: bounds the memory and the per-character cost of matching.
const MAX_PROGRAM: usize = 2000;
/// Bounds the compiler's work, which can exceed the program size when empty groups are
/// repeated (`((){100}){100}` emits nothing but would loop 10,000 times).
const MAX_COMPILE_STEPS: usize = 4 * MAX_PROGRAM;
/// Groups nest at most this deep, bounding the recursion of the parser and the compiler.
const MAX_NESTING: usize = 32;
/// Compiled patterns a worker keeps (see `cached`).
const MEMO_ENTRIES: usize = 64;

thread_local! {
    /// This worker's compiled patterns by pattern: configs arrive with every request, so the
    /// same few patterns are compiled again and again otherwise.
    static MEMO: RefCell<Memo<Regex>> = RefCell::new(Memo::new(MEMO_ENTRIES));
}

/// A compiled pattern.
#[derive(Debug)]
pub struct Regex {
    program: Vec<Inst>,
    ignore_case: bool,
}

/// Compiles `pattern`, or says what is wrong with it.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    let chars: Vec<char> = pattern.chars().collect();
    if chars.len() > MAX_PATTERN_CHARS {
        return Err(format!("longer than {MAX_PATTERN_CHARS} characters"));
    }
    let ignore_case = chars.starts_with(&['(', '?', 'i', ')']);
    // Positions in errors count from the pattern's start, `(?i)` included.
    let mut parser = Parser { chars, pos: if ignore_case { 4 } else { 0 }, depth: 0 };
    let node = parser.alternation()?;
    // The alternation stops only at the end or at a `)` no group opened.
    if parser.pos < parser.chars.len() {
        return Err(format!("unmatched `)` at character {}", parser.pos + 1));
    }
    let mut compiler = Compiler { program: Vec::new(), ignore_case, steps: 0 };
    compiler.node(&node)?;
    compiler.push(Inst::Match)?;
    Ok(Regex { program: compiler.program, ignore_case })
}

/// `pattern` compiled, from this worker's memo when it compiled it lately.
pub fn cached(pattern: &str) -> Result<Rc<Regex>, String> {
    memo::cached(&MEMO, pattern, || compile(pattern))
}

impl Regex {
    /// Whether the pattern matches anywhere in `text`.
    pub fn is_match(&self, text: &str) -> bool {
        let mut current = Threads::new(self.program.len());
        let mut next = Threads::new(self.program.len());
        let mut stack = Vec::new();
        let mut chars = text.chars();
        let mut prev = None;
        let mut at = chars.next();
        loop {
            // An unanchored search: a thread starts at every position.
            if self.add(&mut current, &mut stack, 0, prev, at) {
                return true;
            }
            let Some(c) = at else {
                return false;
            };
            let after = chars.next();
            for &pc in &current.pcs {
                let consumes = match self.program.get(pc) {
                    Some(Inst::Char(want)) => self.fold(c) == *want,
                    Some(Inst::Any) => c != '\n',
                    Some(Inst::Class(class)) => class.contains(c, self.ignore_case),
                    _ => false,
                };
                if consumes && self.add(&mut next, &mut stack, pc + 1, Some(c), after) {
                    return true;
                }
            }
            std::mem::swap(&mut current, &mut next);
            next.clear();
            prev = Some(c);
            at = after;
        }
    }

    /// Adds the thread at `pc` to `threads`, following jumps, splits and assertions (between
    /// `prev` and `at`, the characters either side of the position) to the instructions that
    /// consume a character. True when a thread reaches `Match`.
    fn add(
        &self,
        threads: &mut Threads,
        stack: &mut Vec<usize>,
        pc: usize,
        prev: Option<char>,
        at: Option<char>,
    ) -> bool {
        // An explicit stack rather than recursion: a program may chain many splits.
        stack.clear();
        stack.push(pc);
        while let Some(pc) = stack.pop() {
            if !threads.insert(pc) {
                continue;
            }
            match self.program.get(pc) {
                Some(Inst::Match) => return true,
                Some(Inst::Jmp(to)) => stack.push(*to),
                Some(Inst::Split(first, second)) => {
                    stack.push(*second);
                    stack.push(*first);
                }
                Some(Inst::Assert(assertion)) if assertion.holds(prev, at) => stack.push(pc + 1),
                // Instructions that consume a character wait in `threads` for the next step.
                _ => {}
            }
        }
        false
    }

    /// `c` as literals of this pattern were compiled.
    fn fold(&self, c: char) -> char {
        if self.ignore_case {
            lower(c)
        } else {
            c
        }
    }
}

/// The threads at one position of the text: program counters, each at most once.
struct Threads {
    pcs: Vec<usize>,
    seen: Vec<bool>,
}

impl Threads {
    fn new(size: usize) -> Self {
        Threads { pcs: Vec::with_capacity(size), seen: vec![false; size] }
    }

    /// False when `pc` is already there (or outside the program).
    fn insert(&mut self, pc: usize) -> bool {
        match self.seen.get_mut(pc) {
            Some(seen) if !*seen => {
                *seen = true;
                self.pcs.push(pc);
                true
            }
            _ => false,
        }
    }

    fn clear(&mut self) {
        for pc in self.pcs.drain(..) {
            if let Some(seen) = self.seen.get_mut(pc) {
                *seen = false;
            }
        }
    }
}

#[derive(Debug)]
enum Inst {
    Char(char),
    Any,
    Class(Class),
    Assert(Assertion),
    /// Continue at both targets.
    Split(usize, usize),
    Jmp(usize),
    Match,
}

#[derive(Debug, Clone, Copy)]
enum Assertion {
    Start,
    End,
    WordBoundary,
    NotWordBoundary,
}

impl Assertion {
    fn holds(self, prev: Option<char>, at: Option<char>) -> bool {
        let word = |c: Option<char>| c.is_some_and(|c| Perl::Word.matches(c));
        match self {
            Assertion::Start => prev.is_none(),
            Assertion::End => at.is_none(),
            Assertion::WordBoundary => word(prev) != word(at),
            Assertion::NotWordBoundary => word(prev) == word(at),
        }
    }
}

/// The classes of the `\d`, `\w` and `\s` escapes.
#[derive(Debug, Clone, Copy)]
enum Perl {
    Digit,
    Word,
    Space,
}

impl Perl {
    fn matches(self, c: char) -> bool {
        match self {
            Perl::Digit => c.is_ascii_digit(),
            Perl::Word => c.is_ascii_alphanumeric() || c == '_',
            Perl::Space => c.is_whitespace(),
        }
    }

    /// The class escape `\c` as a class item, if `c` names one (uppercase negates).
    fn item(c: char) -> Option<ClassItem> {
        match c {
            'd' => Some(ClassItem::Perl(Perl::Digit, false)),
            'D' => Some(ClassItem::Perl(Perl::Digit, true)),
            'w' => Some(ClassItem::Perl(Perl::Word, false)),
            'W' => Some(ClassItem::Perl(Perl::Word, true)),
            's' => Some(ClassItem::Perl(Perl::Space, false)),
            'S' => Some(ClassItem::Perl(Perl::Space, true)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum ClassItem {
    /// Inclusive.
    Range(char, char),
    /// A `\d`-style class, negated or not.
    Perl(Perl, bool),
}

#[derive(Debug, Clone)]
struct Class {
    items: Vec<ClassItem>,
    negated: bool,
}

impl Class {
    fn contains(&self, c: char, ignore_case: bool) -> bool {
        let hit = |c: char| {
            self.items.iter().any(|item| match *item {
                ClassItem::Range(low, high) => low <= c && c <= high,
                ClassItem::Perl(perl, negated) => perl.matches(c) != negated,
            })
        };
        // Case-insensitively `[A-Z]` takes `a` and `[a-z]` takes `A`; negation comes after.
        let hit = hit(c) || ignore_case && (hit(lower(c)) || hit(upper(c)));
        hit != self.negated
    }
}

/// The lowercase of `c` when it is a single character (most are), else `c`.
fn lower(c: char) -> char {
    let mut chars = c.to_lowercase();
    match (chars.next(), chars.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// The uppercase of `c` when it is a single character, else `c`.
fn upper(c: char) -> char {
    let mut chars = c.to_uppercase();
    match (chars.next(), chars.next()) {
        (Some(u), None) => u,
        _ => c,
    }
}

/// A parsed pattern.
enum Node {
    Char(char),
    Any,
    Class(Class),
    Assert(Assertion),
    /// A sequence; empty for an empty pattern, group or branch.
    Concat(Vec<Node>),
    Alternation(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

/// Recursive descent over the pattern's characters.
struct Parser {
    chars: Vec<char>,
    pos: usize,
    /// Groups open at `pos`.
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    fn eat(&mut self, c: char) -> bool {
        let found = self.peek() == Some(c);
        if found {
            self.pos += 1;
        }
        found
    }

    /// `a|b|...`, up to the end or a `)`.
    fn alternation(&mut self) -> Result<Node, String> {
        let first = self.concat()?;
        if self.peek() != Some('|') {
            return Ok(first);
        }
        let mut branches = vec![first];
        while self.eat('|') {
            branches.push(self.concat()?);
        }
        Ok(Node::Alternation(branches))
    }

    fn concat(&mut self) -> Result<Node, String> {
        let mut nodes = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            nodes.push(self.repeat()?);
        }
        Ok(Node::Concat(nodes))
    }

    /// An atom and its quantifier, if any.
    fn repeat(&mut self) -> Result<Node, String> {
        let atom = self.atom()?;
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.pos += 1;
                self.counts()?
            }
            _ => return Ok(atom),
        };
        // Take the quantifier's last character: `*`, `+`, `?` or the `}` that `counts` stopped on.
        self.pos += 1;
        // A lazy `?` is taken and changes nothing: only whether the pattern matches is asked.
        self.eat('?');
        if matches!(self.peek(), Some('*' | '+' | '?' | '{')) {
            return Err(format!(
                "quantifier after a quantifier at character {}; wrap the first in (?: )",
                self.pos + 1
            ));
        }
        Ok(Node::Repeat { node: Box::new(atom), min, max })
    }

    /// The counts of `{m}`, `{m,}` or `{m,n}`, from after the `{` up to the `}`.
    fn counts(&mut self) -> Result<(u32, Option<u32>), String> {
        let invalid = || "invalid repetition: write {m}, {m,} or {m,n}, and a literal { as \\{".to_string();
        let min = self.number().ok_or_else(invalid)?;
        let max = if self.eat(',') {
            match self.peek() {
                Some('}') => None,
                _ => Some(self.number().ok_or_else(invalid)?),
            }
        } else {
            Some(min)
        };
        if self.peek() != Some('}') {
            return Err(invalid());
        }
        if min > MAX_REPEAT || max.is_some_and(|max| max > MAX_REPEAT) {
            return Err(format!("repetition counts are at most {MAX_REPEAT}"));
        }
        if let Some(max) = max {
            if max < min {
                return Err(format!("repetition {{{min},{max}}} has its counts in the wrong order"));
            }
        }
        Ok((min, max))
    }

    /// Decimal digits, saturating (anything large is refused by the caller).
    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        let mut n: u32 = 0;
        while let Some(digit) = self.peek().and_then(|c| c.to_digit(10)) {
            n = n.saturating_mul(10).saturating_add(digit);
            self.pos += 1;
        }
        (self.pos > start).then_some(n)
    }

    fn atom(&mut self) -> Result<Node, String> {
        let at = self.pos + 1;
        match self.next() {
            Some('(') => self.group(),
            Some('[') => self.class(),
            Some('.') => Ok(Node::Any),
            Some('^') => Ok(Node::Assert(Assertion::Start)),
            Some('$') => Ok(Node::Assert(Assertion::End)),
            Some('\\') => self.escape(),
            Some('*' | '+' | '?' | '{') => Err(format!("nothing to repeat at character {at}")),
            Some(c) => Ok(Node::Char(c)),
            None => Err("unexpected end of pattern".to_string()),
        }
    }

    /// A group, after its `(`.
    fn group(&mut self) -> Result<Node, String> {
        if self.eat('?') && !self.eat(':') {
            return Err("unsupported group `(?`: only `(?:...)` and a leading `(?i)` are supported".to_string());
        }
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(format!("groups nest more than {MAX_NESTING} levels deep"));
        }
        let node = self.alternation()?;
        if !self.eat(')') {
            return Err("unclosed group `(`".to_string());
        }
        self.depth -= 1;
        Ok(node)
    }

    /// An escape outside classes, after its `\`.
    fn escape(&mut self) -> Result<Node, String> {
        let c = self.next().ok_or("pattern ends with a lone `\\`")?;
        if let Some(item) = Perl::item(c) {
            return Ok(Node::Class(Class { items: vec![item], negated: false }));
        }
        match c {
            'b' => Ok(Node::Assert(Assertion::WordBoundary)),
            'B' => Ok(Node::Assert(Assertion::NotWordBoundary)),
            c => escaped_char(c).map(Node::Char),
        }
    }

    /// A class, after its `[`. A `]` first in the class is a literal, as is a `-` first or last.
    fn class(&mut self) -> Result<Node, String> {
        let negated = self.eat('^');
        let mut items = Vec::new();
        let mut first = true;
        loop {
            let c = self.next().ok_or("unclosed class `[`")?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let low = if c == '\\' {
                let escaped = self.next().ok_or("unclosed class `[`")?;
                if let Some(item) = Perl::item(escaped) {
                    items.push(item);
                    continue;
                }
                escaped_char(escaped)?
            } else {
                c
            };
            let is_range = self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|c| *c != ']');
            if !is_range {
                items.push(ClassItem::Range(low, low));
                continue;
            }
            self.pos += 1;
            let high = match self.next() {
                Some('\\') => {
                    let escaped = self.next().ok_or("unclosed class `[`")?;
                    if Perl::item(escaped).is_some() {
                        return Err(format!("class range `{low}-\\{escaped}` ends in a class"));
                    }
                    escaped_char(escaped)?
                }
                Some(c) => c,
                None => return Err("unclosed class `[`".to_string()),
            };
            if high < low {
                return Err(format!("class range `{low}-{high}` is out of order"));
            }
            items.push(ClassItem::Range(low, high));
        }
        Ok(Node::Class(Class { items, negated }))
    }
}

/// The character an escape `\c` stands for (other than the class escapes).
fn escaped_char(c: char) -> Result<char, String> {
    match c {
        'n' => Ok('\n'),
        't' => Ok('\t'),
        'r' => Ok('\r'),
        'f' => Ok('\x0C'),
        'v' => Ok('\x0B'),
        c if c.is_ascii_punctuation() => Ok(c),
        c => Err(format!("unsupported escape `\\{c}`")),
    }
}

/// Turns the parsed pattern into a program.
struct Compiler {
    program: Vec<Inst>,
    ignore_case: bool,
    steps: usize,
}

impl Compiler {
    fn too_large() -> String {
        format!("too large once its repetitions are expanded (over {MAX_PROGRAM} instructions)")
    }

    /// Appends `inst`; returns its address.
    fn push(&mut self, inst: Inst) -> Result<usize, String> {
        if self.program.len() >= MAX_PROGRAM {
            return Err(Self::too_large());
        }
        self.program.push(inst);
        Ok(self.program.len() - 1)
    }

    /// Sets the targets of the split pushed at `at`, once they are known.
    fn patch(&mut self, at: usize, inst: Inst) {
        if let Some(slot) = self.program.get_mut(at) {
            *slot = inst;
        }
    }

    fn node(&mut self, node: &Node) -> Result<(), String> {
        self.steps += 1;
        if self.steps > MAX_COMPILE_STEPS {
            return Err(Self::too_large());
        }
        match node {
            Node::Char(c) => {
                let c = if self.ignore_case { lower(*c) } else { *c };
                self.push(Inst::Char(c))?;
            }
            Node::Any => {
                self.push(Inst::Any)?;
            }
            Node::Class(class) => {
                self.push(Inst::Class(class.clone()))?;
            }
            Node::Assert(assertion) => {
                self.push(Inst::Assert(*assertion))?;
            }
            Node::Concat(nodes) => {
                for node in nodes {
                    self.node(node)?;
                }
            }
            Node::Alternation(branches) => {
                // split(branch, next split) ... each branch but the last jumps to the end.
                let mut jumps = Vec::new();
                let last = branches.len().saturating_sub(1);
                for (i, branch) in branches.iter().enumerate() {
                    if i == last {
                        self.node(branch)?;
                        break;
                    }
                    let split = self.push(Inst::Split(0, 0))?;
                    self.node(branch)?;
                    jumps.push(self.push(Inst::Jmp(0))?);
                    let next = self.program.len();
                    self.patch(split, Inst::Split(split + 1, next));
                }
                let end = self.program.len();
                for jump in jumps {
                    self.patch(jump, Inst::Jmp(end));
                }
            }
            Node::Repeat { node, min, max } => {
                for _ in 0..*min {
                    self.node(node)?;
                }
                match max {
                    // Any number more: split(body, end); body; jump back to the split.
                    None => {
                        let split = self.push(Inst::Split(0, 0))?;
                        self.node(node)?;
                        self.push(Inst::Jmp(split))?;
                        let end = self.program.len();
                        self.patch(split, Inst::Split(split + 1, end));
                    }
                    // Up to `max - min` more, each optional: split(body, end of this body).
                    Some(max) => {
                        for _ in *min..*max {
                            let split = self.push(Inst::Split(0, 0))?;
                            self.node(node)?;
                            let end = self.program.len();
                            self.patch(split, Inst::Split(split + 1, end));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn is_match(pattern: &str, text: &str) -> bool {
        match compile(pattern) {
            Ok(regex) => regex.is_match(text),
            Err(e) => panic!("{pattern:?} does not compile: {e}"),
        }
    }

    /// Asserts `pattern` matches each of `yes` and none of `no`.
    fn check(pattern: &str, yes: &[&str], no: &[&str]) {
        for text in yes {
            assert!(is_match(pattern, text), "{pattern:?} should match {text:?}");
        }
        for text in no {
            assert!(!is_match(pattern, text), "{pattern:?} should not match {text:?}");
        }
    }

    fn error(pattern: &str) -> String {
        match compile(pattern) {
            Ok(regex) => panic!("{pattern:?} compiled: {regex:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn literals_match_anywhere_unless_anchored() {
        check("gpt", &["gpt", "gpt-4o", "my-gpt", "chatgpt-x"], &["", "GPT", "gp-t"]);
        check("^gpt", &["gpt-4", "gpt"], &["my-gpt"]);
        check("mini$", &["gpt-4o-mini"], &["gpt-4o-mini-2024"]);
        check("^gpt-4o$", &["gpt-4o"], &["gpt-4o-mini", "xgpt-4o"]);
        check("", &["", "anything"], &[]);
        check("^$", &[""], &["a"]);
    }

    #[test]
    fn dot_quantifiers_and_counts() {
        check("a.c", &["abc", "a-c", "aéc"], &["ac", "a\nc"]);
        check("^ab*c$", &["ac", "abc", "abbbc"], &["abd"]);
        check("^ab+c$", &["abc", "abbc"], &["ac"]);
        check("^ab?c$", &["ac", "abc"], &["abbc"]);
        check("^a{3}$", &["aaa"], &["aa", "aaaa"]);
        check("^a{2,}$", &["aa", "aaaaa"], &["a"]);
        check("^a{1,3}$", &["a", "aaa"], &["", "aaaa"]);
        check("^a{0,1}b$", &["b", "ab"], &["aab"]);
        check("^a.*?z$", &["az", "abcz"], &["abc"]);
        check("^(?:ab){2}$", &["abab"], &["ab", "ababab"]);
        check("^x{0}$", &[""], &["x"]);
    }

    #[test]
    fn alternation_and_groups() {
        check("^(gpt-4o|claude)(-mini)?$", &["gpt-4o", "claude-mini", "gpt-4o-mini"], &["gpt-4", "claude-3"]);
        check("cat|dog", &["hotdog", "cats"], &["cow"]);
        check("^(?:a|)b$", &["ab", "b"], &["cb"]);
        check("^(a|b)*c$", &["c", "abbac"], &["abd"]);
        check("^()$", &[""], &["a"]);
    }

    #[test]
    fn classes_and_escapes() {
        check("^[abc]+$", &["abccba"], &["abd"]);
        check("^[^a-z]+$", &["ABC-1"], &["aB"]);
        check("^[a-c-]+$", &["a-b"], &["d"]);
        check("^[]x]+$", &["]x]"], &["y"]);
        check("^[\\d.]+$", &["3.14"], &["3,14"]);
        check("^[\\D]$", &["x"], &["1"]);
        check("^\\d{4}-\\d{2}$", &["2024-08"], &["2024-8", "２０２４-08"]);
        check("^\\w+$", &["gpt_4o"], &["gpt-4o", "é"]);
        check("^\\W$", &["-", "é"], &["a"]);
        check("a\\sb", &["a b", "a\tb", "a\u{a0}b"], &["ab"]);
        check("^\\S\\D$", &["ab"], &[" b", "a1"]);
        check("^gpt\\.4$", &["gpt.4"], &["gpt-4"]);
        check("^\\(\\)\\[\\]\\{\\}\\*\\+\\?\\|\\^\\$\\\\$", &["()[]{}*+?|^$\\"], &[]);
        check("a\\nb\\t", &["a\nb\t"], &["anbt"]);
        check("\\bgpt\\b", &["use gpt now", "gpt"], &["chatgpt", "gpts"]);
        check("gpt\\B", &["gpts"], &["gpt", "gpt-4"]);
        check("a}", &["a}"], &[]);
    }

    #[test]
    fn case_insensitive_prefix() {
        check("(?i)^gpt-4O$", &["GPT-4o", "gpt-4o"], &["gpt-4"]);
        check("(?i)^[a-c]+$", &["AbC"], &["abd"]);
        check("(?i)^[^a-c]$", &["d"], &["A", "b"]);
        check("(?i)straße", &["STRAßE"], &[]);
        check("(?i)Émile", &["émile", "ÉMILE"], &[]);
        check("^GPT", &["GPT"], &["gpt"]);
    }

    #[test]
    fn unicode_text_is_read_as_characters() {
        check("^.{3}$", &["日本語", "a😀b"], &["日本"]);
        check("^[à-ÿ]+$", &["éè"], &["e"]);
        check("😀+", &["x😀😀"], &["x"]);
    }

    #[test]
    fn pathological_patterns_run_in_linear_time() {
        // Backtracking would take exponential time on these and never finish; the clock is
        // checked natively only (wasm32-unknown-unknown has none).
        let many_a = "a".repeat(10_000);
        for pattern in ["(a*)*b", "(a|a)*b", "(a+)+b", "^(a|aa)+$c", "(?:a?){100}a{100}b", "(.*)*b"] {
            #[cfg(not(target_arch = "wasm32"))]
            let start = std::time::Instant::now();
            assert!(!is_match(pattern, &many_a), "{pattern}");
            #[cfg(not(target_arch = "wasm32"))]
            assert!(start.elapsed() < std::time::Duration::from_secs(5), "{pattern} took {:?}", start.elapsed());
        }
        assert!(is_match("(a*)*b", &format!("{many_a}b")));
        assert!(is_match("^(a|aa)+$", &many_a));
    }

    #[test]
    fn bad_patterns_are_errors() {
        let cases = [
            ("(", "unclosed group"),
            ("a)", "unmatched `)`"),
            ("[a", "unclosed class"),
            ("[z-a]", "out of order"),
            ("[a-\\d]", "ends in a class"),
            ("*a", "nothing to repeat"),
            ("a|?", "nothing to repeat"),
            ("a**", "quantifier after a quantifier"),
            ("a{2}{3}", "quantifier after a quantifier"),
            ("a{101}", "at most 100"),
            ("a{1,999999999999}", "at most 100"),
            ("a{3,2}", "wrong order"),
            ("a{", "invalid repetition"),
            ("a{x}", "invalid repetition"),
            ("a{,2}", "invalid repetition"),
            ("a{2", "invalid repetition"),
            ("\\", "lone"),
            ("\\1", "unsupported escape"),
            ("\\p{L}", "unsupported escape"),
            ("(?=a)", "unsupported group"),
            ("(?P<n>a)", "unsupported group"),
            ("a(?i)b", "unsupported group"),
            ("(?s).", "unsupported group"),
        ];
        for (pattern, message) in cases {
            let e = error(pattern);
            assert!(e.contains(message), "{pattern:?}: expected {message:?} in {e:?}");
        }
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(compile(&"a".repeat(MAX_PATTERN_CHARS)).is_ok());
        assert!(error(&"a".repeat(MAX_PATTERN_CHARS + 1)).contains("longer than 1000 characters"));
        assert!(error(&format!("{}{}", "(".repeat(40), ")".repeat(40))).contains("nest more than 32"));
        assert!(compile("(?:a{100}){10}").is_ok());
        assert!(error("(?:(?:a{100}){100}){100}").contains("too large"));
        // Empty groups emit nothing, yet repeating them must not make the compiler spin.
        assert!(error("((((((){100}){100}){100}){100}){100}){100}").contains("too large"));
    }

    #[test]
    fn a_pattern_is_compiled_once_per_worker() {
        let first = cached("\\bmemo\\b").unwrap();
        let again = cached("\\bmemo\\b").unwrap();
        assert!(Rc::ptr_eq(&first, &again));
        assert!(again.is_match("a memo here") && !again.is_match("memos"));
        assert!(cached("(").unwrap_err().contains("unclosed group"));
    }
}
