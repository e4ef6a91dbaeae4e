//! Regular expressions for the `$regex` operator of conditional routing, guardrails'
//! `regexMatch` and JSON schemas' `pattern`: the `regex-lite` crate, with limits for patterns
//! that clients send.
//!
//! `regex-lite` matches in O(text length × compiled size) time whatever the pattern (nothing
//! backtracks, so `(a*)*b` is as fast as `ab`); the limits below bound the compiled size, and
//! so the work per character. Its dialect is the `regex` crate's with ASCII-only `\d \w \s`
//! and ASCII-only case folding; docs/routing.md, Regular expressions, lists what a user sees.

use crate::memo::{self, Memo};
pub use regex_lite::Regex;
use regex_lite::RegexBuilder;
use std::cell::RefCell;
use std::rc::Rc;

/// Longer patterns are refused (in characters): the crate's parser works in proportion to the
/// pattern's length, and a routing or guardrail pattern has no need of more.
const MAX_PATTERN_CHARS: usize = 1000;
/// Largest compiled pattern (bytes of its automaton, `RegexBuilder::size_limit`): bounds the
/// memory and the per-character cost of matching, counted repetitions expanded. In the module
/// (32-bit) that is about 2,000 states (`a{2044}` compiles, `a{2045}` does not), the program
/// size the hand-written engine before allowed; natively (64-bit) states are larger, ~1,270.
const MAX_COMPILED_BYTES: usize = 40 * 1024;
/// Deepest nesting of groups, repetitions and alternations (`RegexBuilder::nest_limit`).
const MAX_NESTING: u32 = 32;
/// Compiled patterns a worker keeps (see `cached`).
const MEMO_ENTRIES: usize = 64;

thread_local! {
    /// This worker's compiled patterns by pattern: configs arrive with every request, so the
    /// same few patterns are compiled again and again otherwise.
    static MEMO: RefCell<Memo<Regex>> = RefCell::new(Memo::new(MEMO_ENTRIES));
}

/// Compiles `pattern`, or says what is wrong with it.
fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.chars().count() > MAX_PATTERN_CHARS {
        return Err(format!("longer than {MAX_PATTERN_CHARS} characters"));
    }
    RegexBuilder::new(pattern).size_limit(MAX_COMPILED_BYTES).nest_limit(MAX_NESTING).build().map_err(|e| e.to_string())
}

/// `pattern` compiled, from this worker's memo when it compiled it lately.
pub fn cached(pattern: &str) -> Result<Rc<Regex>, String> {
    memo::cached(&MEMO, pattern, || compile(pattern))
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

    // The syntax docs/routing.md documents, as the hand-written engine before the crate matched it.
    #[test]
    fn literals_match_anywhere_unless_anchored() {
        check("gpt", &["gpt", "gpt-4o", "my-gpt", "chatgpt-x"], &["", "GPT", "gp-t"]);
        check("^gpt", &["gpt-4", "gpt"], &["my-gpt"]);
        check("mini$", &["gpt-4o-mini"], &["gpt-4o-mini-2024", "gpt-4o-mini\n"]);
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
        check("a\\sb", &["a b", "a\tb"], &["ab"]);
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
        check("^GPT", &["GPT"], &["gpt"]);
    }

    #[test]
    fn unicode_text_is_read_as_characters() {
        check("^.{3}$", &["日本語", "a😀b"], &["日本"]);
        check("^[à-ÿ]+$", &["éè"], &["e"]);
        check("😀+", &["x😀😀"], &["x"]);
    }

    /// What the crate's dialect changed for users (docs/routing.md, Regular expressions).
    #[test]
    fn the_dialect_differences_the_readme_lists() {
        // `\s` and case folding are ASCII-only.
        check("a\\sb", &[], &["a\u{a0}b"]);
        check("(?i)émile", &["éMILE"], &["ÉMILE"]);
        // Flags anywhere, captures by name, hex escapes, `\<` and `\>` as word boundaries.
        check("a(?i)b", &["aB"], &["AB"]);
        check("(?s)^a.b$", &["a\nb"], &[]);
        check("(?m)^b$", &["a\nb\nc"], &[]);
        check("^(?P<model>gpt)-(?<size>mini)$", &["gpt-mini"], &[]);
        check("^\\x41\\u{42}$", &["AB"], &[]);
        check("\\<gpt\\>", &["a gpt b"], &["chatgpt"]);
        check("^[[:digit:]]+$", &["42"], &["4a"]);
        check("^a{1, 2}$", &["a", "aa"], &["aaa"]);
    }

    #[test]
    fn pathological_patterns_run_in_linear_time() {
        // Backtracking would take exponential time on these and never finish (2^10000 steps);
        // linear time takes seconds at most in a debug build on a busy machine, so a minute
        // tells the two apart without being a timing test. The clock is checked natively only
        // (wasm32-unknown-unknown has none).
        let many_a = "a".repeat(10_000);
        for pattern in ["(a*)*b", "(a|a)*b", "(a+)+b", "^(a|aa)+$c", "(?:a?){100}a{100}b", "(.*)*b"] {
            #[cfg(not(target_arch = "wasm32"))]
            let start = std::time::Instant::now();
            assert!(!is_match(pattern, &many_a), "{pattern}");
            #[cfg(not(target_arch = "wasm32"))]
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "{pattern} took {:?}", start.elapsed());
        }
        assert!(is_match("(a*)*b", &format!("{many_a}b")));
        assert!(is_match("^(a|aa)+$", &many_a));
    }

    #[test]
    fn bad_patterns_are_errors() {
        for pattern in [
            "(",
            "a)",
            "[a",
            "[z-a]",
            "[a-\\d]",
            "*a",
            "a|?",
            "a{3,2}",
            "a{",
            "a{x}",
            "a{2",
            "\\",
            "\\1",
            "\\p{L}",
            "\\q",
            "(?=a)",
            "(?<=a)b",
            "(?!a)",
            "a{1,999999999999}",
        ] {
            error(pattern);
        }
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(compile(&"a".repeat(MAX_PATTERN_CHARS)).is_ok());
        assert!(error(&"a".repeat(MAX_PATTERN_CHARS + 1)).contains("longer than 1000 characters"));
        assert!(error(&format!("{}{}", "(".repeat(40), ")".repeat(40))).contains("nest"));
        assert!(compile("(?:a{100}){9}").is_ok());
        assert!(error("(?:(?:a{100}){100}){100}").contains("size limit"));
        assert!(error("a{5000}").contains("size limit"));
        assert!(error("a{4294967295}").contains("size limit"));
        // Empty groups compile to almost nothing, yet repeating them must stay bounded.
        #[cfg(not(target_arch = "wasm32"))]
        let start = std::time::Instant::now();
        assert!(error("((((((){100}){100}){100}){100}){100}){100}").contains("size limit"));
        assert!(error("(?:){4294967295}").contains("size limit"));
        #[cfg(not(target_arch = "wasm32"))]
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "took {:?}", start.elapsed());
    }

    #[test]
    fn a_pattern_is_compiled_once_per_worker() {
        let first = cached("\\bmemo\\b").unwrap();
        let again = cached("\\bmemo\\b").unwrap();
        assert!(Rc::ptr_eq(&first, &again));
        assert!(again.is_match("a memo here") && !again.is_match("memos"));
        assert!(cached("(").is_err());
    }
}
