//! `pattern` keywords: Go (RE2) regular expressions, compiled with the `regex` crate.
//!
//! The two dialects agree except on a few points that matter for validation, which
//! [`translate`] smooths over before compiling:
//! - Go's Perl classes `\d`, `\w`, `\s` and `\b` are ASCII-only; the `regex` crate's are
//!   Unicode-aware, so they are rewritten to their ASCII sets;
//! - inside a character class Go takes `[` (other than `[:name:]`), `&&`, `--` and `~~`
//!   literally, where the `regex` crate reads nested classes and set operations, so they are
//!   escaped.

use regex::Regex;

/// Compiles a Go regular expression.
pub(crate) fn compile(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&translate(pattern))
}

/// Rewrites a Go regular expression into the `regex` crate's syntax with the same meaning.
fn translate(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut in_class = false;
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let next = chars.get(i + 1).copied();
        match (c, in_class) {
            ('\\', _) => {
                let Some(escaped) = next else {
                    out.push('\\');
                    break;
                };
                out.push_str(&translate_escape(escaped, in_class));
                i += 2;
                continue;
            }
            ('[', false) => {
                in_class = true;
                out.push('[');
                i += 1;
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                if chars.get(i) == Some(&']') {
                    out.push_str("\\]");
                    i += 1;
                }
                continue;
            }
            ('[', true) if next == Some(':') => {
                // A POSIX class `[:alpha:]`: copy it through its closing `:]`.
                let rest: String = chars[i..].iter().collect();
                match rest.find(":]") {
                    Some(end) => {
                        out.push_str(&rest[..end + 2]);
                        i += rest[..end + 2].chars().count();
                    }
                    None => {
                        out.push_str("\\[");
                        i += 1;
                    }
                }
                continue;
            }
            ('[', true) => out.push_str("\\["),
            (']', true) => {
                in_class = false;
                out.push(']');
            }
            ('&' | '~' | '-', true) if next == Some(c) => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

fn translate_escape(escaped: char, in_class: bool) -> String {
    let replacement = match (escaped, in_class) {
        ('d', false) => "[0-9]",
        ('D', false) => "[^0-9]",
        ('w', false) => "[0-9A-Za-z_]",
        ('W', false) => "[^0-9A-Za-z_]",
        ('s', false) => "[\\t\\n\\f\\r ]",
        ('S', false) => "[^\\t\\n\\f\\r ]",
        ('b', false) => "(?-u:\\b)",
        ('B', false) => "(?-u:\\B)",
        ('d', true) => "0-9",
        ('w', true) => "0-9A-Za-z_",
        ('s', true) => "\\t\\n\\f\\r ",
        _ => return format!("\\{escaped}"),
    };
    replacement.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, text: &str) -> bool {
        match compile(pattern) {
            Ok(re) => re.is_match(text),
            Err(e) => panic!("{pattern} must compile: {e}"),
        }
    }

    #[test]
    fn perl_classes_are_ascii_only_as_in_go() {
        assert!(matches(r"^\d+$", "123"));
        assert!(!matches(r"^\d+$", "١٢٣"));
        assert!(matches(r"^\D+$", "١٢٣"));
        assert!(!matches(r"^\w+$", "é"));
        assert!(matches(r"^[\w.-]+$", "a_b.c-d"));
        assert!(!matches(r"^[\w]+$", "é"));
        assert!(matches(r"^\s$", "\t"));
        assert!(!matches(r"^\s$", "\u{a0}"));
        assert!(matches(r"\bab\b", "x ab y"));
    }

    #[test]
    fn brackets_and_set_operators_inside_classes_are_literal() {
        assert!(matches(r"^[[]+$", "[["));
        assert!(matches(r"^[]a]+$", "]a"));
        assert!(matches(r"^[a&&b]+$", "&"));
        assert!(matches(r"^[a--]+$", "-"));
        assert!(matches(r"^[[:alpha:]]+$", "abc"));
        assert!(!matches(r"^[[:alpha:]]+$", "a1"));
    }

    #[test]
    fn ordinary_patterns_are_unchanged() {
        for pattern in [
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))$",
            r"\p{L}+",
        ] {
            assert_eq!(translate(pattern), pattern);
        }
    }
}
