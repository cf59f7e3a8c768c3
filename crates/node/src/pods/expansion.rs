//! kubelet's `$(VAR)` expansion of a container's `command`, `args` and `env[].value`.
//!
//! The rules of Kubernetes' `third_party/forked/golang/expansion`: `$(NAME)` becomes the value
//! `lookup` gives for `NAME`, or stays `$(NAME)` verbatim when it gives none; `$$` is an escaped
//! `$`; a `$` followed by anything else, an unterminated `$(` and a trailing `$` stay as they
//! are. Expansion is not recursive: an expanded value is not scanned again.

/// Expands the `$(NAME)` references of `input` with `lookup` (see the module docs).
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            // A trailing `$`.
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                // Unterminated: `$(` stays, scanning goes on after it.
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(other) => {
                out.push('$');
                out.push(other);
                rest = &after[other.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Expands every element of `inputs` against the environment `env` (later entries win, as the
/// process sees them).
pub fn expand_all(inputs: &[String], env: &[(String, String)]) -> Vec<String> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    inputs.iter().map(|s| expand(s, lookup)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<&'static str> {
        match name {
            "VAR_A" => Some("A"),
            "VAR_B" => Some("B"),
            "EMPTY" => Some(""),
            "REF" => Some("$(VAR_A)"),
            _ => None,
        }
    }

    #[test]
    fn defined_references_expand_and_undefined_ones_stay_verbatim() {
        assert_eq!(expand("$(VAR_A)", vars), "A");
        assert_eq!(expand("x-$(VAR_A)-$(VAR_B)-y", vars), "x-A-B-y");
        assert_eq!(expand("$(VAR_A)$(VAR_B)", vars), "AB");
        assert_eq!(expand("$(EMPTY)z", vars), "z");
        assert_eq!(expand("$(UNKNOWN)", vars), "$(UNKNOWN)");
        assert_eq!(expand("a $(UNKNOWN) $(VAR_A)", vars), "a $(UNKNOWN) A");
        assert_eq!(expand("$()", vars), "$()");
        assert_eq!(expand("no references", vars), "no references");
        assert_eq!(expand("", vars), "");
    }

    #[test]
    fn a_double_dollar_escapes_and_other_dollars_stay() {
        assert_eq!(expand("$$(VAR_A)", vars), "$(VAR_A)");
        assert_eq!(expand("$$$(VAR_A)", vars), "$A");
        assert_eq!(expand("$$$$(VAR_A)", vars), "$$(VAR_A)");
        assert_eq!(expand("$$", vars), "$");
        assert_eq!(expand("$VAR_A", vars), "$VAR_A");
        assert_eq!(expand("${VAR_A}", vars), "${VAR_A}");
        assert_eq!(expand("cost: 5$", vars), "cost: 5$");
        assert_eq!(expand("$é$(VAR_B)", vars), "$éB");
    }

    #[test]
    fn an_unterminated_reference_stays_and_values_are_not_expanded_again() {
        assert_eq!(expand("$(VAR_A", vars), "$(VAR_A");
        assert_eq!(expand("x $( y", vars), "x $( y");
        // As upstream: the name runs to the first `)`.
        assert_eq!(expand("$(VAR_A$(VAR_B)", vars), "$(VAR_A$(VAR_B)");
        assert_eq!(expand("$(REF)", vars), "$(VAR_A)");
    }

    #[test]
    fn command_and_args_expand_against_the_container_environment() {
        let env = vec![
            ("NODE_NAME".to_owned(), "node01".to_owned()),
            ("X".to_owned(), "1".to_owned()),
            ("X".to_owned(), "2".to_owned()),
        ];
        let args = vec![
            "--node-name".to_owned(),
            "$(NODE_NAME)".to_owned(),
            "$(X)".to_owned(),
            "$(Y)".to_owned(),
        ];
        assert_eq!(
            expand_all(&args, &env),
            ["--node-name", "node01", "2", "$(Y)"]
        );
    }
}
