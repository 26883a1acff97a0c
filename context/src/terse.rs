//! Terse signatures: a definition line reduced to its name and, for a function, its parameter
//! names (`def run(self, host: str | None = None, **options: t.Any) -> None: ...` →
//! `run(host, **options)`). An outline shows its most important members in full and lists the
//! rest this way, so a large class keeps its whole API in view at a fraction of the bytes; and
//! since types, defaults and return types are left out, a terse entry changes less often than the
//! full line (a push that only retypes a parameter leaves it identical).

/// Keywords after which a name is a type or container, not a function.
const TYPE_KEYWORDS: [&str; 9] = ["class", "struct", "enum", "interface", "trait", "impl", "type", "mod", "union"];

/// Receiver parameters, left out of a terse signature.
const RECEIVERS: [&str; 6] = ["self", "&self", "&mut self", "mut self", "cls", "this"];

/// `line`'s terse form for the definition `name`: `name(params)` for a function or method,
/// `name` for anything else (a field, a constant, a type). `name` itself when it does not occur in
/// the line as a word.
pub(crate) fn terse(line: &str, name: &str) -> String {
    let Some(at) = word_at(line, name) else { return name.to_string() };
    if line[..at].split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| TYPE_KEYWORDS.contains(&w)) {
        return name.to_string();
    }
    let rest = &line[at + name.len()..];
    let rest = skip_generics(rest);
    let Some(open) = rest.strip_prefix('(') else { return name.to_string() };
    let (inner, cut) = match balanced(open) {
        Some(inner) => (inner, false),
        None => (open.strip_suffix('…').unwrap_or(open), true),
    };
    let mut pieces = split_top(inner);
    if cut {
        // The line was cut inside the parameters: the last piece may be partial.
        pieces.pop();
    }
    let mut params: Vec<String> = pieces.into_iter().filter_map(param_name).collect();
    if cut {
        params.push("…".to_string());
    }
    format!("{name}({})", params.join(", "))
}

/// The byte offset of the first occurrence of `name` in `line` as a whole word.
fn word_at(line: &str, name: &str) -> Option<usize> {
    if name.is_empty() {
        return None;
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    let mut from = 0;
    while let Some(i) = line[from..].find(name).map(|i| i + from) {
        let before = line[..i].chars().next_back();
        let after = line[i + name.len()..].chars().next();
        if !before.is_some_and(is_word) && !after.is_some_and(is_word) {
            return Some(i);
        }
        from = i + name.len();
    }
    None
}

/// `rest` past a generic parameter list (`<T: Into<U>>` or `[T any]`) right after a name.
fn skip_generics(rest: &str) -> &str {
    let open = match rest.chars().next() {
        Some('<') => '<',
        Some('[') => '[',
        _ => return rest,
    };
    let close = if open == '<' { '>' } else { ']' };
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close && !(close == '>' && rest[..i].ends_with(['-', '='])) {
            depth -= 1;
            if depth == 0 {
                return &rest[i + 1..];
            }
        }
    }
    rest
}

/// The text up to the parenthesis that closes an already opened one; `None` when it never closes
/// (a signature cut short by the outline's line limit) or closes with another bracket.
fn balanced(s: &str) -> Option<&str> {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return (c == ')').then_some(&s[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// `s` split at commas outside brackets (angle brackets included, arrows excepted) and quotes.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut quote) = (0i32, 0, None::<char>);
    let mut prev = ' ';
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q && prev != '\\' => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '(' | '[' | '{' | '<') => depth += 1,
            (None, '>') if prev == '-' || prev == '=' => {}
            (None, ')' | ']' | '}' | '>') => depth -= 1,
            (None, ',') if depth <= 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        prev = c;
    }
    out.push(&s[start..]);
    out
}

/// A parameter's name as written at the call site: without its type, default, `mut` or
/// receiver; keeps `*args`, `**kwargs`, `...rest` and an optional `?`. `None` for a receiver, a
/// bare `*` or `/`, or an empty piece.
fn param_name(p: &str) -> Option<String> {
    let p = p.trim();
    if p.is_empty() || p == "*" || p == "/" || RECEIVERS.contains(&p) || p.starts_with("self:") {
        return None;
    }
    let p = p.strip_prefix("mut ").unwrap_or(p);
    let lead: String = p.chars().take_while(|c| matches!(c, '*' | '.' | '&')).collect();
    let body = &p[lead.len()..];
    let name: String = body.chars().take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '$')).collect();
    if name.is_empty() {
        // A pattern or something unusual: keep its first word-ish piece.
        let piece: String = p.chars().take_while(|c| !matches!(c, ':' | '=')).collect();
        let piece = piece.trim();
        return (!piece.is_empty()).then(|| piece.to_string());
    }
    let optional = body[name.len()..].trim_start().starts_with('?');
    let lead = lead.trim_start_matches('&');
    Some(format!("{lead}{name}{}", if optional { "?" } else { "" }))
}

#[cfg(test)]
mod tests {
    use super::terse;

    #[test]
    fn functions_keep_their_parameter_names_only() {
        let py = "def run(self, host: str | None = None, port: int | None = None, **options: t.Any) -> None: ...";
        assert_eq!(terse(py, "run"), "run(host, port, **options)");
        assert_eq!(
            terse("    async def fetch(cls, *args, url: str, /, key=\"a,b\") -> X: ...", "fetch"),
            "fetch(*args, url, key)"
        );
        let rs =
            "pub fn walk<P: AsRef<Path>, F: Fn(u8, u8) -> bool>(&mut self, path: P, mut f: F) -> Result<(), Error>;";
        assert_eq!(terse(rs, "walk"), "walk(path, f)");
        let go = "func (c *Command) AddCommand(cmds ...*Command)";
        assert_eq!(terse(go, "AddCommand"), "AddCommand(cmds)");
        assert_eq!(terse("func Map[K comparable, V any](m map[K]V, f func(K, V) bool) []K", "Map"), "Map(m, f)");
        let ts = "async fetch(input: Input, options?: Options<string, number>, ...rest: unknown[]): Promise<Response>";
        assert_eq!(terse(ts, "fetch"), "fetch(input, options?, ...rest)");
        assert_eq!(terse("export const create = (defaults?: Options): KyInstance => ...", "create"), "create");
    }

    #[test]
    fn other_definitions_are_their_name() {
        assert_eq!(terse("    request_class: type[Request]", "request_class"), "request_class");
        assert_eq!(terse("class Flask(App):", "Flask"), "Flask");
        assert_eq!(terse("pub struct Walk<'a> {", "Walk"), "Walk");
        assert_eq!(terse("impl Iterator for Walk {", "Walk"), "Walk");
        assert_eq!(terse("MAX_SIZE = ...", "MAX_SIZE"), "MAX_SIZE");
        assert_eq!(terse("def cut(self, a: int, b: Callable[[int…", "cut"), "cut(a, …)");
        assert_eq!(terse("something else", "missing"), "missing");
    }
}
