use super::*;
use serde_json::json;

fn tools() -> ToolSet {
    ToolSet {
        tools: vec![
            ("read_file".into(), json!({"type": "object", "properties": {"path": {"type": "string"}}})),
            (
                "run".into(),
                json!({"type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"},
                       "env": {"type": "object"}}}),
            ),
        ],
        custom: vec!["apply_patch".into()],
    }
}

/// Content and (name, arguments) of the calls, from deltas.
fn fold(deltas: &[Delta]) -> (String, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(t),
            Delta::Start { index, id, name, .. } => {
                assert_eq!(*index, calls.len(), "calls are numbered in order");
                assert!(id.starts_with("call_") && id.len() == 29, "{id}");
                calls.push((name.clone(), String::new()));
            }
            Delta::Args { index, text } => calls[*index].1.push_str(text),
        }
    }
    (content, calls)
}

/// Parses `text` whole, then in pieces of every size from 1 to 7 bytes (on char
/// boundaries): the streamed result must always equal the whole one.
fn parse(text: &str) -> (String, Vec<(String, String)>) {
    let (content, calls) = parse_all(&tools(), text);
    for c in &calls {
        assert!(c.id.starts_with("call_") && c.id.len() == 29, "{}", c.id);
    }
    let whole = (content, calls.into_iter().map(|c| (c.name, c.arguments)).collect());
    for size in 1..=7 {
        let mut p = CallParser::new(tools());
        let mut deltas = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut cut = size.min(rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            deltas.extend(p.push(&rest[..cut]));
            rest = &rest[cut..];
        }
        deltas.extend(p.finish());
        assert_eq!(fold(&deltas), whole, "pieces of {size} bytes of {text:?}");
    }
    whole
}

fn call(name: &str, args: &str) -> (String, String) {
    (name.to_string(), args.to_string())
}

#[test]
fn hermes_calls_with_text_before_them() {
    let text =
        "Let me look.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.rs\"}}\n</tool_call>";
    assert_eq!(parse(text), ("Let me look.\n".into(), vec![call("read_file", r#"{"path": "a.rs"}"#)]));
    let two = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n\
               <tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"ls }{\\\"\", \"env\": {\"A\": [1, {}]}}}\n</tool_call>";
    let (content, calls) = parse(two);
    assert_eq!(content, "", "whitespace between and after calls is not content");
    assert_eq!(
        calls,
        vec![call("read_file", r#"{"path": "a"}"#), call("run", r#"{"cmd": "ls }{\"", "env": {"A": [1, {}]}}"#)]
    );
    serde_json::from_str::<Value>(&calls[1].1).unwrap();
}

#[test]
fn prose_after_calls_stays_content() {
    let (content, calls) = parse("<tool_call>{\"name\": \"run\"}</tool_call>\n\nDone, see above.");
    assert_eq!((content.as_str(), calls.len()), ("\n\nDone, see above.", 1));
    // The start of another call, cut off by the token limit, is markup: never content.
    let (content, _) = parse("{\"name\": \"run\", \"arguments\": {}}\n  <tool");
    assert_eq!(content, "");
    let (content, _) = parse("{\"name\": \"run\", \"arguments\": {}}\n  <tools are nice");
    assert_eq!(content, "\n  <tools are nice");
}

#[test]
fn tolerated_variants() {
    // Missing closing tag at the end, "parameters", arguments as a JSON string, no newlines.
    let (c, calls) = parse("<tool_call>{\"name\": \"run\", \"parameters\": {\"cmd\": \"ls\"}}");
    assert_eq!((c.as_str(), calls), ("", vec![call("run", r#"{"cmd": "ls"}"#)]));
    let (_, calls) = parse("<tool_call>{\"name\":\"run\",\"arguments\":\"{\\\"cmd\\\": \\\"ls\\\"}\"}</tool_call>");
    assert_eq!(calls, vec![call("run", r#"{"cmd": "ls"}"#)]);
    // A call with no arguments at all.
    let (_, calls) = parse("<tool_call>{\"name\": \"run\"}</tool_call>");
    assert_eq!(calls, vec![call("run", "{}")]);
    // A list of calls in one tag; a second tag without the first one's closing tag.
    let (_, calls) =
        parse("<tool_call>[{\"name\": \"run\", \"arguments\": {}}, {\"name\": \"read_file\", \"arguments\": {\"path\": \"x\"}}]</tool_call>");
    assert_eq!(calls, vec![call("run", "{}"), call("read_file", r#"{"path": "x"}"#)]);
    let (_, calls) =
        parse("<tool_call>{\"name\": \"run\", \"arguments\": {}}\n<tool_call>{\"name\": \"run\", \"arguments\": {\"cmd\": \"x\"}}");
    assert_eq!(calls.len(), 2);
}

#[test]
fn bare_and_fenced_json_calls_of_known_tools() {
    let (c, calls) = parse("  {\"name\": \"read_file\", \"arguments\": {\"path\": \"b\"}}");
    assert_eq!((c.trim(), calls), ("", vec![call("read_file", r#"{"path": "b"}"#)]));
    let (c, calls) = parse("[{\"name\": \"run\", \"parameters\": {\"cmd\": \"x\"}}]");
    assert_eq!((c.trim(), calls), ("", vec![call("run", r#"{"cmd": "x"}"#)]));
    let (c, calls) = parse("```json\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"make\"}}\n```");
    assert_eq!((c.trim(), calls), ("", vec![call("run", r#"{"cmd":"make"}"#)]));
    // Unknown names, other keys and other fences stay content, whole.
    for text in [
        "{\"name\": \"delete_everything\", \"arguments\": {}}",
        "{\"answer\": 42, \"name\": \"run\"}",
        "```rust\nfn main() {}\n```",
        "```json\n{\"a\": 1}\n```\nThat is the config.",
        "[1, 2, 3]",
    ] {
        assert_eq!(parse(text), (text.to_string(), vec![]), "{text}");
    }
}

#[test]
fn a_call_on_its_own_line_after_prose() {
    // What the 0.5B model writes under Qwen Code's prompt: prose, then the call as bare JSON.
    let text = "Got it. Here's the response:\n\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"/w/notes.txt\"}}";
    let (c, calls) = parse(text);
    assert_eq!(
        (c.as_str(), calls),
        ("Got it. Here's the response:\n\n", vec![call("read_file", r#"{"path":"/w/notes.txt"}"#)])
    );
    // Fenced and pretty-printed, with prose after it.
    let text = "I will run it:\n```json\n{\n  \"name\": \"run\",\n  \"parameters\": {\"cmd\": \"make\"}\n}\n```\nDone.";
    let (c, calls) = parse(text);
    assert_eq!(calls, vec![call("run", r#"{"cmd":"make"}"#)]);
    assert_eq!(c, "I will run it:\n\nDone.");
    // Lines that are not whole calls of known tools stay content, whole.
    for text in [
        "The config:\n{\"name\": \"cachet\", \"port\": 8080}\nThat is all.",
        "Like this:\n{\"name\": \"delete_everything\", \"arguments\": {}}",
        "Broken:\n{\"name\": \"run\", \"arguments\": {\"cmd\": ",
        "A fence:\n```rust\nfn main() {}\n```\n",
        "Data:\n```json\n[1, 2]\n```",
        "Nested:\n  {\n  {\"a\": 1}\n}",
        "ends with a newline\n",
        "ends with a partial fence\n``",
    ] {
        assert_eq!(parse(text), (text.to_string(), vec![]), "{text}");
    }
}

#[test]
fn qwen3_coder_xml_calls() {
    let text = "I will run it.\n<tool_call>\n<function=run>\n<parameter=cmd>\ncargo test -- --nocapture\n</parameter>\n\
                <parameter=timeout>\n30\n</parameter>\n<parameter=env>\n{\"RUST_LOG\": \"debug\"}\n</parameter>\n</function>\n</tool_call>";
    let (c, calls) = parse(text);
    assert_eq!(c, "I will run it.\n");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "run");
    let args: Value = serde_json::from_str(&calls[0].1).unwrap();
    assert_eq!(args, json!({"cmd": "cargo test -- --nocapture", "timeout": 30, "env": {"RUST_LOG": "debug"}}));
    // A string parameter that looks like a number stays a string.
    let (_, calls) =
        parse("<tool_call>\n<function=read_file>\n<parameter=path>\n42\n</parameter>\n</function>\n</tool_call>");
    assert_eq!(calls, vec![call("read_file", r#"{"path":"42"}"#)]);
}

#[test]
fn plain_text_is_never_held_or_changed() {
    for text in [
        "a < b and c <= d; <tool is not a tag",
        "ends with a partial tag <tool_ca",
        "`inline` code",
        "",
        "   ",
        "{ not json",
        "<tool_call>not a call</tool_call> after",
    ] {
        let (content, calls) = parse(text);
        assert!(calls.is_empty(), "{text}");
        assert_eq!(content, text, "{text}");
    }
}

#[test]
fn markup_never_reaches_content_and_arguments_stream_early() {
    let mut p = CallParser::new(tools());
    let mut seen = Vec::new();
    for piece in [
        "Sure",
        "! <tool",
        "_call>\n{\"na",
        "me\": \"run\", \"arguments\": {\"cmd\"",
        ": \"ls -la",
        "\"}}\n</tool_",
        "call>",
    ] {
        seen.push(p.push(piece));
    }
    seen.push(p.finish());
    let all: Vec<Delta> = seen.iter().flatten().cloned().collect();
    assert!(all.iter().all(|d| !matches!(d, Delta::Content(t) if t.contains('<') || t.contains('{'))), "{all:?}");
    // The name goes out as soon as it is complete, argument pieces as they arrive.
    assert!(
        matches!(&seen[3][..], [Delta::Start { name, .. }, Delta::Args { text, .. }] if name == "run" && text == "{\"cmd\"")
    );
    assert!(matches!(&seen[4][..], [Delta::Args { text, .. }] if text == ": \"ls -la"));
    assert_eq!(fold(&all).1, vec![call("run", r#"{"cmd": "ls -la"}"#)]);
}

#[test]
fn a_call_repeated_back_to_back_is_left_out() {
    let read = |path: &str| {
        format!("<tool_call>\n{{\"name\": \"read_file\", \"arguments\": {{\"path\": \"{path}\"}}}}\n</tool_call>")
    };
    let text = [read("a"), read("a"), read("b"), read("b"), read("a")].join("\n");
    let (content, calls) = parse(&text);
    assert_eq!(content, "");
    let args = |p: &str| format!("{{\"path\": \"{p}\"}}");
    assert_eq!(
        calls,
        vec![call("read_file", &args("a")), call("read_file", &args("b")), call("read_file", &args("a"))]
    );
    // The same arguments written differently are the same call.
    let spaced = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\":\"a\"}}\n</tool_call>";
    let (_, calls) = parse(&format!("{}\n{spaced}", read("a")));
    assert_eq!(calls.len(), 1);
    // Another tool with the same arguments is another call.
    let run = "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>";
    assert_eq!(parse(&format!("{}\n{run}", read("a"))).1.len(), 2);
    let mut p = CallParser::new(tools());
    p.push(&read("a"));
    assert!(!p.repeated());
    p.push(&format!("\n{}", read("a")));
    assert!(p.repeated(), "known as soon as the repeat's arguments are whole");
    assert_eq!(p.calls(), 1);
}

#[test]
fn the_start_of_a_call_cut_off_by_the_limit_is_not_content() {
    let one = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>";
    for tail in ["\n<", "\n<tool_", "\n\n<tool_call", " "] {
        let (content, calls) = parse(&format!("{one}{tail}"));
        assert_eq!((content.as_str(), calls.len()), ("", 1), "{tail:?}");
    }
}

#[test]
fn a_fence_around_a_tagged_call_is_not_content() {
    let one = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>";
    for (text, want) in [
        (format!("Here are the arguments:\n\n```\n{one}\n```"), "Here are the arguments:\n\n"),
        (format!("```json\n{one}\n```"), ""),
        (format!("Reading it.\n```xml\n{one}\n```\nDone."), "Reading it.\n\nDone."),
    ] {
        let (content, calls) = parse(&text);
        assert_eq!(calls.len(), 1, "{text:?}");
        assert_eq!(content, want, "{text:?}");
    }
    // A fence that holds something else stays content.
    let (content, calls) = parse("Run:\n```\nls -la\n```\n");
    assert_eq!((content.as_str(), calls.len()), ("Run:\n```\nls -la\n```\n", 0));
}

#[test]
fn custom_tool_input_is_taken_verbatim_and_streamed() {
    let patch =
        "*** Begin Patch\n*** Update File: calc.py\n@@\n-def add(a, b):\n+def add(a, b):  # </function\n*** End Patch";
    let text = format!("I will patch it.\n<tool_call>\n<function=apply_patch>\n{patch}\n</function>\n</tool_call>");
    assert_eq!(parse(&text), ("I will patch it.\n".into(), vec![call("apply_patch", patch)]));
    // Beside a function call, and cut off by the token limit (the input so far is the call's).
    let text = format!(
        "<tool_call>\n{{\"name\": \"read_file\", \"arguments\": {{\"path\": \"a\"}}}}\n</tool_call>\n\
         <tool_call>\n<function=apply_patch>\n{patch}\n</func"
    );
    let (content, calls) = parse(&text);
    assert_eq!(content, "");
    assert_eq!(calls, vec![call("read_file", r#"{"path": "a"}"#), call("apply_patch", patch)]);
    // An empty input.
    let (_, calls) = parse("<tool_call>\n<function=apply_patch>\n\n</function>\n</tool_call>");
    assert_eq!(calls, vec![call("apply_patch", "")]);
    let (_, calls) = parse_all(&tools(), "<tool_call>\n<function=apply_patch>\nx\n</function>\n</tool_call>");
    assert!(calls[0].custom);
}

/// What the Qwen2.5-Coder 1.5B answered Codex with in 7 of 24 repository tasks: a custom tool's
/// `<function=NAME>` call without its `<tool_call>` tags. It is a call when NAME is one of the
/// request's tools; otherwise, and anywhere but at the start or after a call, it is content.
#[test]
fn a_call_without_its_tool_call_tags() {
    let patch = "*** Begin Patch\n*** Update File: more.py\n@@\n-    pass\n+    return 1\n*** End Patch";
    assert_eq!(
        parse(&format!("<function=apply_patch>\n{patch}\n</function>")),
        (String::new(), vec![call("apply_patch", patch)])
    );
    assert_eq!(
        parse(&format!("\n <function=apply_patch>\n{patch}\n</function>\n")).1,
        vec![call("apply_patch", patch)]
    );
    // A function tool's, in the XML form; then another call, tagged or not, and prose after.
    let text = format!(
        "<function=read_file>\n<parameter=path>\na.py\n</parameter>\n</function>\n\
         <function=apply_patch>\n{patch}\n</function>\nDone."
    );
    let (content, calls) = parse(&text);
    assert_eq!(calls, vec![call("read_file", r#"{"path":"a.py"}"#), call("apply_patch", patch)]);
    assert_eq!(content, "\nDone.");
    // Cut off by the token limit: the input so far.
    assert_eq!(
        parse("<function=apply_patch>\n*** Begin Patch\n*** Add").1,
        vec![call("apply_patch", "*** Begin Patch\n*** Add")]
    );
    // Not a call: an unknown name, a tag that never closes, the tag after prose.
    for text in [
        "<function=launch_rocket>\nnow\n</function>",
        "<function=",
        "<functi",
        "<func>tion</func>",
        "Call it like this: <function=apply_patch>\nx\n</function>",
    ] {
        assert_eq!(parse(text), (text.to_string(), vec![]), "{text}");
    }
    let long = format!("<function={}", "a".repeat(200));
    assert_eq!(parse(&long), (long.clone(), vec![]));
}
