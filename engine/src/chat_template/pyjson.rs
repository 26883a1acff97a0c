//! Python's `json.dumps` for template values: the `tojson` filter.
//!
//! Hugging Face replaces Jinja's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
//! and chat templates put its output straight into the prompt, so it must be
//! byte-identical: `", "` and `": "` separators (`","` when indenting), keys in
//! insertion order, non-ASCII kept, no HTML escaping, floats as Python's `repr`
//! (`1.0`, `1e-05`, `1e+16`), control characters as `\u001f`. minijinja's own
//! `tojson` differs (compact and HTML-escaped), hence this module.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `json.dumps` options.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DumpOptions {
    /// Escape everything outside printable ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: one item per line, indented by `s` per level.
    pub indent: Option<String>,
    /// Between items.
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    /// Sort object keys.
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The `tojson` filter: `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// arguments positional or by keyword as in Python.
pub(crate) fn tojson_filter(value: &Value, positional: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if positional.len() > NAMES.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, value) in given.iter_mut().zip(positional) {
        *slot = Some(value.clone());
    }
    for (slot, name) in given.iter_mut().zip(NAMES) {
        if kwargs.has(name) {
            *slot = Some(kwargs.get::<Value>(name)?);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let mut options = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..DumpOptions::default()
    };
    match indent {
        Some(v) if v.is_none() || v.is_undefined() => {}
        Some(v) => {
            options.indent = Some(match v.as_str() {
                Some(s) => s.to_string(),
                None => {
                    let n = i64::try_from(v.clone()).map_err(|_| {
                        Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")
                    })?;
                    " ".repeat(n.max(0) as usize)
                }
            });
            options.item_separator = ",".into();
        }
        None => {}
    }
    if let Some(v) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = v.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                options.item_separator = item.as_str().unwrap_or_default().to_string();
                options.key_separator = key.as_str().unwrap_or_default().to_string();
            }
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings")),
        }
    }
    Ok(Value::from(dumps(value, &options)?))
}

/// Serializes `value` as Python's `json.dumps` would with these options.
pub(crate) fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn not_serializable(value: &Value) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: object of kind {} is not JSON serializable", value.kind()))
}

fn write_value(out: &mut String, value: &Value, options: &DumpOptions, depth: usize) -> Result<(), Error> {
    if depth > 512 {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: nesting too deep"));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => write_str(out, value.as_str().unwrap_or_default(), options.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), options, depth, |out, i| {
                write_value(out, &items[i], options, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, '{', '}', entries.len(), options, depth, |out, i| {
                let (key, item) = &entries[i];
                write_str(out, key, options.ensure_ascii);
                out.push_str(&options.key_separator);
                write_value(out, item, options, depth + 1)
            })?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// Writes `[a, b]` / `{…}`, one line or indented like Python.
fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    options: &DumpOptions,
    depth: usize,
    mut write_item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for i in 0..len {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, depth + 1);
        write_item(out, i)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python turns `True`/`None`/numbers used as keys into strings.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {}", key.kind()),
        )),
    }
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        let n = i128::try_from(value.clone()).map_err(|_| not_serializable(value))?;
        out.push_str(&n.to_string());
    } else {
        let f = f64::try_from(value.clone()).map_err(|_| not_serializable(value))?;
        out.push_str(&python_float_repr(f));
    }
    Ok(())
}

/// Python's `float.__repr__` as `json.dumps` writes it (`NaN`/`Infinity` too).
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if f == 0.0 {
        return format!("{sign}0.0");
    }
    // Shortest round-trip digits, e.g. "1.2345e-5".
    let scientific = format!("{:e}", f.abs());
    let (mantissa, exp) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let mantissa = if digits.len() == 1 { digits } else { format!("{}.{}", &digits[..1], &digits[1..]) };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{exp_sign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// A JSON string literal as Python writes it.
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps_json(json: &str, options: &DumpOptions) -> String {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        dumps(&super::super::json_to_value(&value), options).unwrap()
    }

    #[test]
    fn matches_python_default_layout() {
        let options = DumpOptions::default();
        // Expected strings are Python 3.11's json.dumps(x, ensure_ascii=False).
        assert_eq!(
            dumps_json(r#"{"z": 1, "a": [true, null, 2.5, "é\"\n"], "e": {}, "l": []}"#, &options),
            r#"{"z": 1, "a": [true, null, 2.5, "é\"\n"], "e": {}, "l": []}"#
        );
        assert_eq!(dumps_json(r#""<a href='x'>&</a>""#, &options), r#""<a href='x'>&</a>""#);
        assert_eq!(dumps_json(r#""\u001f\u007f\u2028😀""#, &options), "\"\\u001f\u{7f}\u{2028}😀\"");
    }

    #[test]
    fn ensure_ascii_indent_and_sorting() {
        let options = DumpOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            item_separator: ",".into(),
            sort_keys: true,
            ..DumpOptions::default()
        };
        // json.dumps({"b": ["é", "😀"], "a": {}}, ensure_ascii=True, indent=2, sort_keys=True)
        assert_eq!(
            dumps_json(r#"{"b": ["é", "😀"], "a": {}}"#, &options),
            "{\n  \"a\": {},\n  \"b\": [\n    \"\\u00e9\",\n    \"\\ud83d\\ude00\"\n  ]\n}"
        );
    }

    #[test]
    fn floats_like_python_repr() {
        for (value, python) in [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (2.5e-5, "2.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1e15, "1000000000000000.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(python_float_repr(value), python, "{value:e}");
        }
    }

    #[test]
    fn undefined_is_not_serializable() {
        let err = dumps(&Value::UNDEFINED, &DumpOptions::default()).unwrap_err();
        assert!(err.to_string().contains("not JSON serializable"), "{err}");
    }
}
