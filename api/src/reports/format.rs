//! Text of the report page: HTML escaping and how numbers are shown.
//!
//! Every formatter shows a missing or non-finite value as [`NONE`], so that no `NaN` or `inf`
//! ever reaches the page.

/// What the page shows for a missing value.
pub const NONE: &str = "—";

/// `s` escaped for HTML text and (quoted) attribute values: `& < > " '`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An optional value shown with `fmt`, or [`NONE`].
pub fn opt(v: Option<f64>, fmt: fn(f64) -> String) -> String {
    v.map_or_else(|| NONE.to_string(), fmt)
}

/// A count with thousands separators: `1234567` → `1,234,567`.
pub fn int(v: i64) -> String {
    group(&v.to_string())
}

/// A number with about three significant digits: `0.000123`, `12.3`, `1,235`, `1.23e20`.
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        return NONE.to_string();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".to_string()
    } else if !(1e-4..1e15).contains(&a) {
        format!("{v:.2e}")
    } else if a >= 1000.0 {
        group(&format!("{v:.0}"))
    } else {
        let decimals = (2 - a.log10().floor() as i32).clamp(0, 6) as usize;
        trim(format!("{v:.decimals$}"))
    }
}

/// An amount in US dollars: cents from a dollar up (`$1,234.50`), three significant digits below
/// (`$0.0123`, `$0.000456`), scientific notation when tiny or huge (`$1.20e-7`).
pub fn usd(v: f64) -> String {
    if !v.is_finite() {
        return NONE.to_string();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    let a = v.abs();
    let body = if a == 0.0 {
        "0.00".to_string()
    } else if !(1e-4..1e15).contains(&a) {
        format!("{a:.2e}")
    } else if a >= 1.0 {
        group(&format!("{a:.2}"))
    } else {
        number(a)
    };
    format!("{sign}${body}")
}

/// A ratio as a percentage: `0.875` → `87.5%`.
pub fn pct(ratio: f64) -> String {
    if !ratio.is_finite() {
        return NONE.to_string();
    }
    format!("{}%", number(ratio * 100.0))
}

/// A duration in milliseconds: `123 ms`.
pub fn ms(v: f64) -> String {
    if !v.is_finite() {
        return NONE.to_string();
    }
    format!("{} ms", number(v))
}

/// A rate in requests per second: `0.0123 req/s`.
pub fn rps(v: f64) -> String {
    if !v.is_finite() {
        return NONE.to_string();
    }
    format!("{} req/s", number(v))
}

/// `digits` (an optional sign, digits, an optional fraction) with its integer part grouped by
/// thousands.
fn group(digits: &str) -> String {
    let (sign, rest) = digits.strip_prefix('-').map_or(("", digits), |r| ("-", r));
    let (whole, frac) = rest.split_once('.').map_or((rest, None), |(w, f)| (w, Some(f)));
    let mut out = String::from(sign);
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(frac) = frac {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// A decimal number without trailing zeros after its point (nor a trailing point).
fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_the_five_characters() {
        assert_eq!(
            escape(r#"<a href="x">Tom & 'Jerry'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("plain — text"), "plain — text");
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(int(0), "0");
        assert_eq!(int(999), "999");
        assert_eq!(int(1000), "1,000");
        assert_eq!(int(-1234567), "-1,234,567");
        assert_eq!(int(i64::MIN), "-9,223,372,036,854,775,808");
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.000123), "0.000123");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(250.0), "250");
        assert_eq!(number(1234.6), "1,235");
        assert_eq!(number(1e20), "1.00e20");
        assert_eq!(number(1e-9), "1.00e-9");
        assert_eq!(number(f64::NAN), NONE);
        assert_eq!(number(f64::INFINITY), NONE);
    }

    #[test]
    fn dollars_pick_a_precision_that_shows_small_amounts() {
        assert_eq!(usd(0.0), "$0.00");
        assert_eq!(usd(0.0123), "$0.0123");
        assert_eq!(usd(0.000456), "$0.000456");
        assert_eq!(usd(1.5), "$1.50");
        assert_eq!(usd(1234.5), "$1,234.50");
        assert_eq!(usd(1.2e-7), "$1.20e-7");
        assert_eq!(usd(f64::MAX), "$1.80e308");
        assert_eq!(usd(-2.0), "-$2.00");
        assert_eq!(usd(f64::NEG_INFINITY), NONE);
    }

    #[test]
    fn percentages_durations_and_rates() {
        assert_eq!(pct(0.875), "87.5%");
        assert_eq!(pct(1.0), "100%");
        assert_eq!(pct(0.0), "0%");
        assert_eq!(opt(None, pct), NONE);
        assert_eq!(ms(123.4), "123 ms");
        assert_eq!(rps(0.0123), "0.0123 req/s");
        assert_eq!(rps(f64::NAN), NONE);
    }
}
