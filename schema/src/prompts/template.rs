//! Mustache templates of prompts, parsed once into a tree and then rendered against the
//! request's variables. Written here rather than taken from a crate: `mustache2`, the maintained
//! Mustache crate, cannot turn HTML escaping off and has no missing-variable error, and
//! `handlebars` (which has both, and rendered these templates before) was ~215 KB of the filter's
//! module for what this file does (bench/README.md, Module size).
//!
//! Besides Mustache's tags, handlebars' `{{#each x}}`, `{{#if x}}`, `{{#unless x}}`,
//! `{{#with x}}` blocks with `{{else}}`, and the names `this`, `../x`, `@root.x`, `@index`,
//! `@key`, `@first`, `@last` work as they did when handlebars rendered them. A tag alone on its
//! line (a block's open, close or `{{else}}`, a comment) takes the line with it.

use serde_json::Value;

/// Deepest nesting of blocks a template may have (rendering recurses once per level).
const MAX_DEPTH: usize = 32;
/// Most work one rendering may do: one unit per node rendered, per item a block goes through and
/// per byte written, so that blocks nested over lists can neither grow the output nor loop
/// without bound.
pub(super) const MAX_RENDER_WORK: usize = 4 << 20;

/// Why a template could not be parsed or rendered.
#[derive(Debug, PartialEq)]
pub(super) enum TemplateError {
    /// The template is not valid: what is wrong.
    Invalid(String),
    /// A name the template uses that the variables lack, as the template writes it.
    Missing(String),
    /// Rendering would exceed `MAX_RENDER_WORK`.
    TooMuchWork,
}

/// A parsed template; its text borrows the source.
#[derive(Debug)]
pub(super) struct Template<'t> {
    nodes: Vec<Node<'t>>,
}

#[derive(Debug)]
enum Node<'t> {
    Text(&'t str),
    /// `{{name}}`, `{{{name}}}` or `{{&name}}`: all insert the value as it is.
    Value(Name<'t>),
    Block(Block<'t>),
}

#[derive(Debug)]
struct Block<'t> {
    kind: BlockKind,
    name: Name<'t>,
    body: Vec<Node<'t>>,
    /// After `{{else}}`, if the block has one.
    otherwise: Option<Vec<Node<'t>>>,
}

#[derive(Debug, Clone, Copy)]
enum BlockKind {
    /// `{{#name}}`: once per item of a list, once with an object as context, once if truthy.
    Section,
    /// `{{^name}}`: once if falsy.
    Inverted,
    Each,
    If,
    Unless,
    With,
}

impl BlockKind {
    /// The handlebars block `{{#word name}}` opens, if `word` names one.
    fn helper(word: &str) -> Option<Self> {
        match word {
            "each" => Some(Self::Each),
            "if" => Some(Self::If),
            "unless" => Some(Self::Unless),
            "with" => Some(Self::With),
            _ => None,
        }
    }
}

/// A name as the template writes it and where it is looked up.
#[derive(Debug)]
struct Name<'t> {
    written: &'t str,
    start: Start,
    /// Keys (or list indexes) followed from the start.
    keys: Vec<&'t str>,
}

#[derive(Debug, Clone, Copy)]
enum Start {
    /// The current context: the variables, or the item or object a block is over.
    Current,
    /// The context this many blocks out (`../`).
    Outer(usize),
    /// The variables (`@root`).
    Root,
    /// Where `{{#each}}` or a section over a list stands.
    Index,
    Key,
    First,
    Last,
}

impl<'t> Name<'t> {
    fn parse(written: &'t str) -> Result<Self, TemplateError> {
        if written.is_empty() {
            return Err(TemplateError::Invalid("a tag has no name".to_string()));
        }
        if written.contains(char::is_whitespace) {
            return Err(invalid(written, "names only: helpers and arguments are not supported"));
        }
        let mut outer = 0;
        let mut rest = written;
        while let Some(after) = rest.strip_prefix("../") {
            outer += 1;
            rest = after;
        }
        if outer == 0 {
            rest = rest.strip_prefix("./").unwrap_or(rest);
        }
        let current = if outer == 0 { Start::Current } else { Start::Outer(outer) };
        let segments: Vec<&str> = if rest == "." { Vec::new() } else { rest.split('.').collect() };
        let (start, keys) = match segments.split_first() {
            Some((&"this", keys)) => (current, keys),
            Some((&"@root", keys)) if outer == 0 => (Start::Root, keys),
            Some((&"@index", [])) if outer == 0 => (Start::Index, &[][..]),
            Some((&"@key", [])) if outer == 0 => (Start::Key, &[][..]),
            Some((&"@first", [])) if outer == 0 => (Start::First, &[][..]),
            Some((&"@last", [])) if outer == 0 => (Start::Last, &[][..]),
            Some((first, _)) if first.starts_with('@') => {
                return Err(invalid(written, "not one of `@root`, `@index`, `@key`, `@first`, `@last`"))
            }
            _ => (current, &segments[..]),
        };
        if keys.iter().any(|key| key.is_empty()) {
            return Err(invalid(written, "a name has an empty key"));
        }
        Ok(Name { written, start, keys: keys.to_vec() })
    }
}

fn invalid(tag: &str, why: &str) -> TemplateError {
    TemplateError::Invalid(format!("`{{{{{}}}}}`: {why}", crate::json_check::shorten(tag)))
}

/// One tag as read from the source.
enum Tag<'t> {
    Value(&'t str),
    /// `{{#...}}` or `{{^...}}` (`inverted`), with what follows the sigil.
    Open(&'t str, bool),
    Close(&'t str),
    Else,
    Comment,
}

impl Tag<'_> {
    /// Whether the tag, alone on its line, takes the line with it (Mustache's standalone tags).
    fn takes_its_line(&self) -> bool {
        !matches!(self, Tag::Value(_))
    }
}

/// A block being parsed.
struct Open<'t> {
    /// The word its close tag must repeat (`each`, or the section's name).
    closed_by: &'t str,
    kind: BlockKind,
    name: Name<'t>,
    body: Vec<Node<'t>>,
    otherwise: Option<Vec<Node<'t>>>,
}

impl<'t> Template<'t> {
    pub(super) fn parse(source: &'t str) -> Result<Self, TemplateError> {
        let mut tree = Tree { root: Vec::new(), open: Vec::new() };
        let mut rest = source;
        // Whether `rest` starts a line: a tag alone on its line takes the line with it.
        let mut at_line_start = true;
        // After a tag ending `~}}`: the text that follows loses its leading whitespace.
        let mut trim_next = false;
        while let Some(start) = rest.find("{{") {
            let mut text = rest.get(..start).unwrap_or_default();
            if trim_next {
                text = text.trim_start();
            }
            let from_tag = rest.get(start..).unwrap_or_default();
            // `\{{` is a literal `{{` (and `\\{{` a backslash before a tag), as in handlebars.
            if let Some(before) = text.strip_suffix('\\') {
                if !before.ends_with('\\') {
                    tree.text(before);
                    tree.text(from_tag.get(..2).unwrap_or_default());
                    rest = from_tag.get(2..).unwrap_or_default();
                    (at_line_start, trim_next) = (false, false);
                    continue;
                }
                text = before;
            }
            let read = read_tag(from_tag)?;
            rest = from_tag.get(read.length..).unwrap_or_default();
            let indent = match text.rfind('\n') {
                Some(newline) => text.get(newline + 1..),
                None => at_line_start.then_some(text),
            };
            let standalone =
                read.tag.takes_its_line() && indent.is_some_and(|indent| indent.chars().all(|c| c == ' ' || c == '\t'));
            let after = rest.trim_start_matches([' ', '\t', '\r']);
            at_line_start = standalone && (after.is_empty() || after.starts_with('\n'));
            if at_line_start {
                let indent = indent.map_or(0, str::len);
                text = text.get(..text.len() - indent).unwrap_or_default();
                rest = after.get(1..).unwrap_or_default();
            }
            if read.trim_before {
                text = text.trim_end();
            }
            trim_next = read.trim_after;
            tree.text(text);
            tree.tag(read.tag)?;
        }
        tree.text(if trim_next { rest.trim_start() } else { rest });
        tree.finish()
    }

    /// The template with `variables` (the root context) filled in.
    pub(super) fn render(&self, variables: &Value) -> Result<String, TemplateError> {
        let mut out = Output { text: String::new(), work_left: MAX_RENDER_WORK };
        let scope = Scope { value: variables, position: None, outer: None };
        out.nodes(&self.nodes, variables, &scope)?;
        Ok(out.text)
    }
}

/// The nodes parsed so far: the template's, and those of the blocks still open.
struct Tree<'t> {
    root: Vec<Node<'t>>,
    open: Vec<Open<'t>>,
}

impl<'t> Tree<'t> {
    /// Where the next node goes: the innermost open block's body, or after its `{{else}}` the
    /// other branch.
    fn nodes(&mut self) -> &mut Vec<Node<'t>> {
        match self.open.last_mut() {
            Some(block) => block.otherwise.as_mut().unwrap_or(&mut block.body),
            None => &mut self.root,
        }
    }

    fn text(&mut self, text: &'t str) {
        if !text.is_empty() {
            self.nodes().push(Node::Text(text));
        }
    }

    fn tag(&mut self, tag: Tag<'t>) -> Result<(), TemplateError> {
        match tag {
            Tag::Value(name) => self.nodes().push(Node::Value(Name::parse(name)?)),
            Tag::Comment => {}
            Tag::Open(inner, inverted) => {
                if self.open.len() >= MAX_DEPTH {
                    return Err(TemplateError::Invalid(format!("blocks nest more than {MAX_DEPTH} levels deep")));
                }
                self.open.push(open_block(inner, inverted)?);
            }
            Tag::Else => match self.open.last_mut() {
                Some(block) if block.otherwise.is_none() => block.otherwise = Some(Vec::new()),
                Some(block) => return Err(invalid(&format!("#{}", block.closed_by), "has a second `{{else}}`")),
                None => return Err(TemplateError::Invalid("`{{else}}` outside a block".to_string())),
            },
            Tag::Close(closed) => {
                let Some(block) = self.open.pop() else {
                    return Err(invalid(&format!("/{closed}"), "closes no block"));
                };
                if block.closed_by != closed {
                    let why = format!("closes `{{{{#{}}}}}`", crate::json_check::shorten(block.closed_by));
                    return Err(invalid(&format!("/{closed}"), &why));
                }
                let Open { kind, name, body, otherwise, .. } = block;
                self.nodes().push(Node::Block(Block { kind, name, body, otherwise }));
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Template<'t>, TemplateError> {
        match self.open.last() {
            Some(block) => Err(invalid(&format!("#{}", block.closed_by), "is never closed")),
            None => Ok(Template { nodes: self.root }),
        }
    }
}

/// A tag read from the source.
struct ReadTag<'t> {
    tag: Tag<'t>,
    /// Bytes from `{{` to `}}` included.
    length: usize,
    /// Handlebars' whitespace control: `{{~` trims the text before, `~}}` the text after.
    trim_before: bool,
    trim_after: bool,
}

/// The tag at the start of `source` (which starts with `{{`).
fn read_tag(source: &str) -> Result<ReadTag<'_>, TemplateError> {
    let (open, close) = if source.starts_with("{{!--") {
        ("{{!--", "--}}")
    } else if source.starts_with("{{{") {
        ("{{{", "}}}")
    } else {
        ("{{", "}}")
    };
    let after_open = source.get(open.len()..).unwrap_or_default();
    let Some(end) = after_open.find(close) else {
        let start: String = source.chars().take(16).collect();
        return Err(TemplateError::Invalid(format!("`{start}` is never closed with `{close}`")));
    };
    let length = open.len() + end + close.len();
    let mut inner = after_open.get(..end).unwrap_or_default();
    if open == "{{!--" {
        return Ok(ReadTag { tag: Tag::Comment, length, trim_before: false, trim_after: false });
    }
    let trim_before = open == "{{" && inner.starts_with('~');
    let trim_after = open == "{{" && inner.len() > usize::from(trim_before) && inner.ends_with('~');
    if trim_before {
        inner = inner.get(1..).unwrap_or_default();
    }
    if trim_after {
        inner = inner.get(..inner.len() - 1).unwrap_or_default();
    }
    let inner = inner.trim();
    let mut chars = inner.chars();
    let sigil = chars.next();
    let rest = chars.as_str().trim();
    let tag = match sigil {
        _ if open == "{{{" => Tag::Value(inner),
        Some('!') => Tag::Comment,
        Some('#') => Tag::Open(rest, false),
        Some('^') if rest.is_empty() => Tag::Else,
        Some('^') => Tag::Open(rest, true),
        Some('/') => Tag::Close(rest),
        Some('&') => Tag::Value(rest),
        Some('>') => return Err(invalid(inner, "partials are not supported")),
        Some('=') => return Err(invalid(inner, "changing the delimiters is not supported")),
        _ if inner == "else" => Tag::Else,
        _ => Tag::Value(inner),
    };
    Ok(ReadTag { tag, length, trim_before, trim_after })
}

/// The block `{{#inner}}` (or `{{^inner}}`) opens.
fn open_block(inner: &str, inverted: bool) -> Result<Open<'_>, TemplateError> {
    let sigil = if inverted { "^" } else { "#" };
    let mut words = inner.split_whitespace();
    let (Some(first), second, None) = (words.next(), words.next(), words.next()) else {
        return Err(invalid(&format!("{sigil}{inner}"), "a block takes one name"));
    };
    let (kind, name) = match (BlockKind::helper(first), second, inverted) {
        (Some(kind), Some(name), false) => (kind, name),
        (Some(_), None, false) => return Err(invalid(&format!("#{first}"), "needs a name")),
        (None, None, false) => (BlockKind::Section, first),
        (None, None, true) => (BlockKind::Inverted, first),
        _ => return Err(invalid(&format!("{sigil}{inner}"), "a block takes one name")),
    };
    Ok(Open { closed_by: first, kind, name: Name::parse(name)?, body: Vec::new(), otherwise: None })
}

/// Where a block over a list or an object stands, for `@index`, `@key`, `@first`, `@last`.
struct Position {
    index: Value,
    key: Option<Value>,
    first: bool,
    last: bool,
}

/// A context: the variables, or what a block is over, inside the contexts around it.
struct Scope<'s> {
    value: &'s Value,
    position: Option<Position>,
    outer: Option<&'s Scope<'s>>,
}

static TRUE: Value = Value::Bool(true);
static FALSE: Value = Value::Bool(false);

/// The value `name` names, if there is one.
fn lookup<'s>(name: &Name, root: &'s Value, scope: &'s Scope<'s>) -> Option<&'s Value> {
    let flag = |set: bool| if set { &TRUE } else { &FALSE };
    let start = match name.start {
        Start::Current => scope.value,
        Start::Root => root,
        Start::Outer(levels) => {
            let mut at = scope;
            // As in handlebars, `../` past the variables stays at the variables.
            for _ in 0..levels {
                at = at.outer.unwrap_or(at);
            }
            at.value
        }
        Start::Index => &scope.position.as_ref()?.index,
        Start::Key => scope.position.as_ref()?.key.as_ref()?,
        Start::First => flag(scope.position.as_ref()?.first),
        Start::Last => flag(scope.position.as_ref()?.last),
    };
    name.keys.iter().try_fold(start, |value, key| match value {
        Value::Object(fields) => fields.get(*key),
        Value::Array(items) => items.get(key.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Whether a block shows its body (for `{{^x}}`, `{{#unless x}}`: its other branch).
fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(set) => *set,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
    }
}

/// The text rendered so far and the work it may still do.
struct Output {
    text: String,
    work_left: usize,
}

impl Output {
    fn spend(&mut self, work: usize) -> Result<(), TemplateError> {
        self.work_left = self.work_left.checked_sub(work).ok_or(TemplateError::TooMuchWork)?;
        Ok(())
    }

    fn write(&mut self, text: &str) -> Result<(), TemplateError> {
        self.spend(text.len())?;
        self.text.push_str(text);
        Ok(())
    }

    fn nodes<'s>(&mut self, nodes: &[Node], root: &'s Value, scope: &'s Scope<'s>) -> Result<(), TemplateError> {
        for node in nodes {
            self.spend(1)?;
            match node {
                Node::Text(text) => self.write(text)?,
                Node::Value(name) => match lookup(name, root, scope) {
                    Some(Value::String(s)) => self.write(s)?,
                    Some(Value::Null) => {}
                    // Numbers and booleans as written; lists and objects as JSON.
                    Some(other) => self.write(&other.to_string())?,
                    None => return Err(TemplateError::Missing(name.written.to_string())),
                },
                Node::Block(block) => self.block(block, root, scope)?,
            }
        }
        Ok(())
    }

    fn block<'s>(&mut self, block: &Block, root: &'s Value, scope: &'s Scope<'s>) -> Result<(), TemplateError> {
        let value = match (lookup(&block.name, root, scope), block.kind) {
            (Some(value), _) => value,
            // `{{#if x}}` is how a template tests for an optional variable; `{{#each x}}` and
            // `{{#with x}}` with an `{{else}}` branch too (as in handlebars).
            (None, BlockKind::If | BlockKind::Unless) => &Value::Null,
            (None, BlockKind::Each | BlockKind::With) if block.otherwise.is_some() => &Value::Null,
            (None, _) => return Err(TemplateError::Missing(block.name.written.to_string())),
        };
        // Mustache shows a section over any object, even an empty one.
        let shown = match value {
            Value::Object(_) if matches!(block.kind, BlockKind::Section | BlockKind::Inverted) => true,
            _ => is_truthy(value),
        };
        match (block.kind, value) {
            (BlockKind::Section | BlockKind::Each, Value::Array(items)) if shown => {
                for (i, item) in items.iter().enumerate() {
                    let position = Position { index: i.into(), key: None, first: i == 0, last: i + 1 == items.len() };
                    self.within(&block.body, root, scope, item, Some(position))?;
                }
                Ok(())
            }
            (BlockKind::Each, Value::Object(fields)) if shown => {
                for (i, (key, item)) in fields.iter().enumerate() {
                    let key = Some(Value::String(key.clone()));
                    let position = Position { index: i.into(), key, first: i == 0, last: i + 1 == fields.len() };
                    self.within(&block.body, root, scope, item, Some(position))?;
                }
                Ok(())
            }
            (BlockKind::Section, Value::Object(_)) | (BlockKind::With, _) if shown => {
                self.within(&block.body, root, scope, value, None)
            }
            (BlockKind::Section | BlockKind::If, _) if shown => self.nodes(&block.body, root, scope),
            (BlockKind::Inverted | BlockKind::Unless, _) if !shown => self.nodes(&block.body, root, scope),
            _ => self.nodes(block.otherwise.as_deref().unwrap_or_default(), root, scope),
        }
    }

    /// `nodes` with `value` as their context.
    fn within<'s>(
        &mut self,
        nodes: &[Node],
        root: &'s Value,
        outer: &'s Scope<'s>,
        value: &'s Value,
        position: Option<Position>,
    ) -> Result<(), TemplateError> {
        // Counted even when `nodes` is empty: blocks nested over long lists loop without writing.
        self.spend(1)?;
        let scope = Scope { value, position, outer: Some(outer) };
        self.nodes(nodes, root, &scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn render(template: &str, variables: Value) -> Result<String, TemplateError> {
        Template::parse(template)?.render(&variables)
    }

    fn invalid_because(template: &str) -> String {
        match Template::parse(template) {
            Err(TemplateError::Invalid(why)) => why,
            other => panic!("{template:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn variables_insert_values_as_given() {
        let vars = json!({"name": "<b>Ann & \"co\"</b>", "n": 3, "f": 1.5, "on": true, "nothing": null,
            "list": ["a", 1], "user": {"name": "Ann"}});
        assert_eq!(
            render("{{name}}|{{{name}}}|{{&name}}", vars.clone()).unwrap(),
            ["<b>Ann & \"co\"</b>"; 3].join("|")
        );
        assert_eq!(render("{{n}} {{f}} {{on}} [{{nothing}}]", vars.clone()).unwrap(), "3 1.5 true []");
        assert_eq!(render("{{list}} {{user}}", vars.clone()).unwrap(), r#"["a",1] {"name":"Ann"}"#);
        assert_eq!(render("{{user.name}} {{list.1}} {{this.user.name}} {{./n}}", vars).unwrap(), "Ann 1 Ann 3");
    }

    #[test]
    fn whitespace_inside_tags_is_ignored() {
        let vars = json!({"name": "Ann", "items": ["a", "b"]});
        assert_eq!(render("{{ name }} {{{ name }}} {{& name }}", vars.clone()).unwrap(), "Ann Ann Ann");
        assert_eq!(render("{{# items }}{{ . }}{{/ items }}{{ ^items }}none{{ /items }}", vars.clone()).unwrap(), "ab");
        assert_eq!(render("{{#each  items }}{{this}}{{/each}}", vars).unwrap(), "ab");
    }

    #[test]
    fn a_missing_name_is_an_error_naming_it_as_written() {
        let vars = json!({"user": {"name": "Ann"}, "s": "text", "items": [{"a": 1}]});
        for (template, missing) in [
            ("{{nope}}", "nope"),
            ("{{user.age}}", "user.age"),
            ("{{user.name.first}}", "user.name.first"),
            ("{{s.length}}", "s.length"),
            ("{{gone.deeper}}", "gone.deeper"),
            ("{{{user.age}}}", "user.age"),
            ("{{#items}}{{b}}{{/items}}", "b"),
            ("{{#items}}{{user}}{{/items}}", "user"),
            ("{{#nope}}x{{/nope}}", "nope"),
            ("{{^nope}}x{{/nope}}", "nope"),
            ("{{#each nope}}x{{/each}}", "nope"),
            ("{{#with user.age}}x{{/with}}", "user.age"),
            ("{{@root.nope}}", "@root.nope"),
            ("{{@index}}", "@index"),
        ] {
            assert_eq!(render(template, vars.clone()), Err(TemplateError::Missing(missing.to_string())), "{template}");
        }
        // Present but null is not missing.
        assert_eq!(render("[{{v}}]", json!({"v": null})).unwrap(), "[]");
    }

    #[test]
    fn sections_go_over_lists_objects_and_truthy_values() {
        let vars = json!({"names": ["x", "y"], "nums": [1, 2], "items": [{"n": "a"}, {"n": "b"}], "user": {"name": "Ann"},
            "empty": {}, "on": true, "off": false, "zero": 0, "blank": "", "none": [], "null": null, "top": "T"});
        assert_eq!(render("{{#names}}{{.}},{{/names}}{{#nums}}{{this}}{{/nums}}", vars.clone()).unwrap(), "x,y,12");
        assert_eq!(render("{{#items}}[{{n}}]{{/items}}", vars.clone()).unwrap(), "[a][b]");
        assert_eq!(render("{{#user}}{{name}} {{@root.top}} {{../top}}{{/user}}", vars.clone()).unwrap(), "Ann T T");
        assert_eq!(render("{{#empty}}shown{{/empty}}{{^empty}}hidden{{/empty}}", vars.clone()).unwrap(), "shown");
        assert_eq!(render("{{#on}}{{top}}{{/on}}", vars.clone()).unwrap(), "T");
        let falsy = "{{#off}}1{{/off}}{{#zero}}2{{/zero}}{{#blank}}3{{/blank}}{{#none}}4{{/none}}{{#null}}5{{/null}}";
        assert_eq!(render(falsy, vars.clone()).unwrap(), "");
        let inverted =
            "{{^off}}1{{/off}}{{^zero}}2{{/zero}}{{^blank}}3{{/blank}}{{^none}}4{{/none}}{{^null}}5{{/null}}";
        assert_eq!(render(inverted, vars.clone()).unwrap(), "12345");
        assert_eq!(
            render("{{#names}}{{@index}}{{#if @first}}^{{/if}}{{#if @last}}${{/if}}{{/names}}", vars).unwrap(),
            "0^1$"
        );
    }

    #[test]
    fn blocks_nest_and_each_level_sees_its_own_context() {
        let vars = json!({"groups": [{"g": "1", "members": ["a", "b"]}, {"g": "2", "members": []}], "sep": "/"});
        let template =
            "{{#groups}}{{g}}:{{#members}}{{.}}{{../g}}{{@root.sep}}{{/members}}{{^members}}-{{/members}};{{/groups}}";
        assert_eq!(render(template, vars.clone()).unwrap(), "1:a1/b1/;2:-;");
        let template = "{{#each groups}}{{#with this}}{{g}}{{#each members}}{{@index}}{{.}}{{/each}}{{/with}}{{/each}}";
        assert_eq!(render(template, vars).unwrap(), "10a1b2");
    }

    #[test]
    fn handlebars_blocks_and_else() {
        let vars = json!({"on": true, "off": false, "obj": {}, "kv": {"k1": "v1", "k2": "v2"}, "names": [], "user": {"name": "Ann"}});
        assert_eq!(render("{{#if on}}a{{else}}b{{/if}}{{#if gone}}c{{else}}d{{/if}}", vars.clone()).unwrap(), "ad");
        assert_eq!(
            render("{{#unless on}}a{{else}}b{{/unless}}{{#if obj}}c{{else}}d{{/if}}", vars.clone()).unwrap(),
            "bd"
        );
        assert_eq!(render("{{#each kv}}{{@key}}={{.}};{{/each}}", vars.clone()).unwrap(), "k1=v1;k2=v2;");
        assert_eq!(render("{{#each names}}x{{^}}empty{{/each}}", vars.clone()).unwrap(), "empty");
        assert_eq!(render("{{#each gone}}x{{else}}no list{{/each}}", vars.clone()).unwrap(), "no list");
        assert_eq!(render("{{#with user}}{{name}}{{/with}}{{#off}}x{{else}}y{{/off}}", vars).unwrap(), "Anny");
    }

    #[test]
    fn a_tag_alone_on_its_line_takes_the_line() {
        let vars = json!({"items": ["a", "b"], "on": true});
        let template = "List:\n  {{#items}}\n  - {{.}}\n  {{/items}}\n{{! note }}\nEnd";
        assert_eq!(render(template, vars.clone()).unwrap(), "List:\n  - a\n  - b\nEnd");
        assert_eq!(render("{{#on}}\r\nyes\r\n{{/on}}\r\n", vars.clone()).unwrap(), "yes\r\n");
        // Not alone: the text around stays.
        assert_eq!(render("a {{#on}}\nyes\n{{/on}} b", vars.clone()).unwrap(), "a \nyes\n b");
        assert_eq!(render("{{on}}\n{{on}}", vars.clone()).unwrap(), "true\ntrue");
        assert_eq!(render("a {{~#on~}} b {{~/on}}\n c", vars).unwrap(), "ab\n c");
    }

    #[test]
    fn comments_and_escaped_braces_render_nothing_of_their_own() {
        let vars = json!({"x": "X"});
        assert_eq!(render("a{{! a comment }}b{{!-- has }} inside --}}c", vars.clone()).unwrap(), "abc");
        assert_eq!(render(r"\{{x}} \\{{x}}", vars).unwrap(), r"{{x}} \X");
    }

    #[test]
    fn malformed_templates_are_errors_naming_the_tag() {
        for (template, why) in [
            ("Hi {{name", "`{{name` is never closed with `}}`"),
            ("Hi {{{name}}", "`{{{name}}` is never closed with `}}}`"),
            ("{{!-- open", "`{{!-- open` is never closed with `--}}`"),
            ("{{#items}}x", "`{{#items}}`: is never closed"),
            ("{{#each items}}{{#if on}}x{{/if}}", "`{{#each}}`: is never closed"),
            ("{{#a}}x{{/b}}", "`{{/b}}`: closes `{{#a}}`"),
            ("{{#a}}{{#b}}x{{/a}}{{/b}}", "`{{/a}}`: closes `{{#b}}`"),
            ("x{{/a}}", "`{{/a}}`: closes no block"),
            ("{{else}}", "`{{else}}` outside a block"),
            ("{{#if a}}x{{else}}y{{else}}z{{/if}}", "`{{#if}}`: has a second `{{else}}`"),
            ("{{}}", "a tag has no name"),
            ("{{ }}", "a tag has no name"),
            ("{{#if}}{{/if}}", "`{{#if}}`: needs a name"),
            ("{{#a b}}{{/a}}", "`{{#a b}}`: a block takes one name"),
            ("{{upper name}}", "`{{upper name}}`: names only: helpers and arguments are not supported"),
            ("{{a..b}}", "`{{a..b}}`: a name has an empty key"),
            ("{{@foo}}", "`{{@foo}}`: not one of `@root`, `@index`, `@key`, `@first`, `@last`"),
            ("{{> partial}}", "`{{> partial}}`: partials are not supported"),
            ("{{=<% %>=}}", "`{{=<% %>=}}`: changing the delimiters is not supported"),
        ] {
            assert_eq!(invalid_because(template), why, "{template}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let nested = |depth: usize| format!("{}x{}", "{{#a}}".repeat(depth), "{{/a}}".repeat(depth));
        assert_eq!(render(&nested(MAX_DEPTH), json!({"a": true})).unwrap(), "x");
        assert_eq!(invalid_because(&nested(MAX_DEPTH + 1)), format!("blocks nest more than {MAX_DEPTH} levels deep"));
        assert_eq!(
            invalid_because(&"{{#a}}".repeat(100_000)),
            format!("blocks nest more than {MAX_DEPTH} levels deep")
        );
    }

    #[test]
    fn rendering_work_is_bounded() {
        let vars = json!({"a": (0..100).collect::<Vec<u32>>(), "kb": "k".repeat(1024)});
        let nested = |depth: usize, inside: &str| {
            format!("{}{inside}{}", "{{#@root.a}}".repeat(depth), "{{/@root.a}}".repeat(depth))
        };
        // 100^4 iterations that write nothing, and 100^3 copies of a 1 KB value.
        assert_eq!(render(&nested(4, ""), vars.clone()), Err(TemplateError::TooMuchWork));
        assert_eq!(render(&nested(3, "{{@root.kb}}"), vars.clone()), Err(TemplateError::TooMuchWork));
        assert_eq!(render(&nested(2, "."), vars).unwrap().len(), 10_000);
    }
}
