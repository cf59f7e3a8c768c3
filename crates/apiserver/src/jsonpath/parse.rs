//! The parser: JSONPath text → a list of [`Segment`]s.
//!
//! Grammar (kubectl's JSONPath, as `additionalPrinterColumns[].jsonPath` uses it; the
//! surrounding `{}` are optional and a leading `$` is the root):
//!
//! ```text
//! path      = ["$"] { segment }
//! segment   = "." name | ".*" | ".." (name | "*" | bracket) | bracket
//! bracket   = "[" ( quoted | "*" | int | [int] ":" [int] [":" int] | "?(" filter ")" ) "]"
//! filter    = operand [ op operand ]          op = "==" | "!=" | "<" | "<=" | ">" | ">="
//! operand   = "@" { segment } | "$" { segment } | quoted | number | "true" | "false" | "null"
//! ```
//!
//! A name runs up to the next `.`, `[`, `]`, blank, parenthesis or operator; `\.` puts a dot
//! into a name (`.metadata.labels.app\.kubernetes\.io/name`).

use serde_json::Value;

use super::{Filter, JsonPathError, Op, Operand, Segment};

/// Parses a whole expression.
pub(super) fn parse(expr: &str) -> Result<Vec<Segment>, JsonPathError> {
    let fail = |message: &str| JsonPathError {
        expr: expr.to_owned(),
        message: message.to_owned(),
    };
    let trimmed = expr.trim();
    let inner = match trimmed.strip_prefix('{') {
        Some(rest) => rest
            .strip_suffix('}')
            .ok_or_else(|| fail("unclosed action: missing '}'"))?,
        None => trimmed,
    };
    if inner.contains('{') || inner.contains('}') {
        return Err(fail("only one template action is supported"));
    }
    let inner = inner.trim();
    if inner.is_empty() {
        return Err(fail("empty path"));
    }
    let mut parser = Parser {
        chars: inner.chars().collect(),
        pos: 0,
    };
    if parser.peek() == Some('$') {
        parser.pos += 1;
    }
    if !matches!(parser.peek(), Some('.' | '[') | None) {
        return Err(fail("a path must start with '.' or '['"));
    }
    let segments = parser.segments(false).map_err(|m| fail(&m))?;
    if let Some(c) = parser.peek() {
        return Err(fail(&format!(
            "unexpected {c:?} at position {}",
            parser.pos
        )));
    }
    Ok(segments)
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

/// Characters that end a field name.
fn ends_name(c: char) -> bool {
    c.is_whitespace() || ".[](),=!<>'\"".contains(c)
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    fn skip_blanks(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected {c:?} at position {}", self.pos))
        }
    }

    /// Segments up to the end (or, inside a filter, up to a blank, `)` or an operator).
    fn segments(&mut self, in_filter: bool) -> Result<Vec<Segment>, String> {
        let mut segments = Vec::new();
        loop {
            match self.peek() {
                Some('.') => {
                    self.pos += 1;
                    if self.peek() == Some('.') {
                        self.pos += 1;
                        segments.push(Segment::Recursive);
                        if self.peek() == Some('[') {
                            continue;
                        }
                        if self.peek().is_none_or(ends_name) {
                            return Err("'..' must be followed by a name, '*' or '['".to_owned());
                        }
                    }
                    match self.peek() {
                        Some('*') => {
                            self.pos += 1;
                            segments.push(Segment::Wildcard);
                        }
                        Some(c) if !ends_name(c) => segments.push(Segment::Field(self.name()?)),
                        _ => {}
                    }
                }
                Some('[') => {
                    self.pos += 1;
                    segments.push(self.bracket()?);
                }
                None => return Ok(segments),
                Some(c) if in_filter && (ends_name(c) || c == ')') => return Ok(segments),
                Some(c) => return Err(format!("unexpected {c:?} at position {}", self.pos)),
            }
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if c == '\\' {
                match self.peek_at(1) {
                    Some(escaped) => {
                        name.push(escaped);
                        self.pos += 2;
                        continue;
                    }
                    None => return Err("dangling '\\' at the end".to_owned()),
                }
            }
            if ends_name(c) {
                break;
            }
            name.push(c);
            self.pos += 1;
        }
        if name.is_empty() {
            return Err(format!("expected a field name at position {}", self.pos));
        }
        Ok(name)
    }

    fn quoted(&mut self) -> Result<String, String> {
        let Some(quote) = self.peek().filter(|c| *c == '\'' || *c == '"') else {
            return Err(format!("expected a quote at position {}", self.pos));
        };
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err("unterminated quoted string".to_owned()),
                Some('\\') => {
                    let escaped = self
                        .peek_at(1)
                        .ok_or_else(|| "unterminated quoted string".to_owned())?;
                    text.push(match escaped {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                    self.pos += 2;
                }
                Some(c) if c == quote => {
                    self.pos += 1;
                    return Ok(text);
                }
                Some(c) => {
                    text.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    /// The inside of `[...]`, after the `[`; consumes the `]`.
    fn bracket(&mut self) -> Result<Segment, String> {
        self.skip_blanks();
        let segment = match self.peek() {
            Some('\'' | '"') => Segment::Field(self.quoted()?),
            Some('*') => {
                self.pos += 1;
                Segment::All
            }
            Some('?') => {
                self.pos += 1;
                self.skip_blanks();
                self.expect('(')?;
                let filter = self.filter()?;
                self.skip_blanks();
                self.expect(')')?;
                Segment::Filter(Box::new(filter))
            }
            _ => self.index_or_slice()?,
        };
        self.skip_blanks();
        if self.peek() == Some(',') {
            return Err("unions are not supported".to_owned());
        }
        self.expect(']')?;
        Ok(segment)
    }

    fn index_or_slice(&mut self) -> Result<Segment, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c != ']') {
            self.pos += 1;
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        let int = |s: &str| -> Result<Option<i64>, String> {
            let s = s.trim();
            if s.is_empty() {
                return Ok(None);
            }
            s.parse::<i64>()
                .map(Some)
                .map_err(|_| format!("invalid array index {s:?}"))
        };
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            [single] => int(single)?
                .map(Segment::Index)
                .ok_or_else(|| "empty array index".to_owned()),
            [from, to] => Ok(Segment::Slice {
                start: int(from)?,
                end: int(to)?,
                step: 1,
            }),
            [from, to, step] => {
                let step = int(step)?.unwrap_or(1);
                if step <= 0 {
                    return Err(format!("slice step must be positive, got {step}"));
                }
                Ok(Segment::Slice {
                    start: int(from)?,
                    end: int(to)?,
                    step,
                })
            }
            _ => Err(format!("invalid array slice {text:?}")),
        }
    }

    fn filter(&mut self) -> Result<Filter, String> {
        self.skip_blanks();
        let left = self.operand()?;
        self.skip_blanks();
        if self.peek() == Some(')') {
            return Ok(Filter { left, cmp: None });
        }
        let op = match (self.peek(), self.peek_at(1)) {
            (Some('='), Some('=')) => Op::Eq,
            (Some('!'), Some('=')) => Op::Ne,
            (Some('<'), Some('=')) => Op::Le,
            (Some('>'), Some('=')) => Op::Ge,
            (Some('<'), _) => Op::Lt,
            (Some('>'), _) => Op::Gt,
            _ => return Err(format!("expected an operator at position {}", self.pos)),
        };
        self.pos += if matches!(op, Op::Lt | Op::Gt) { 1 } else { 2 };
        self.skip_blanks();
        let right = self.operand()?;
        Ok(Filter {
            left,
            cmp: Some((op, right)),
        })
    }

    fn operand(&mut self) -> Result<Operand, String> {
        match self.peek() {
            Some('@') => {
                self.pos += 1;
                Ok(Operand::Path {
                    root: false,
                    segments: self.segments(true)?,
                })
            }
            Some('$') => {
                self.pos += 1;
                Ok(Operand::Path {
                    root: true,
                    segments: self.segments(true)?,
                })
            }
            Some('\'' | '"') => Ok(Operand::Literal(Value::String(self.quoted()?))),
            Some(c) if c == '-' || c.is_ascii_digit() => self.number(),
            Some(_) => {
                let word = self.name()?;
                match word.as_str() {
                    "true" => Ok(Operand::Literal(Value::Bool(true))),
                    "false" => Ok(Operand::Literal(Value::Bool(false))),
                    "null" => Ok(Operand::Literal(Value::Null)),
                    other => Err(format!("unrecognized identifier {other:?} in filter")),
                }
            }
            None => Err("unterminated filter".to_owned()),
        }
    }

    fn number(&mut self) -> Result<Operand, String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_digit() || "-+.eE".contains(c))
        {
            self.pos += 1;
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        let number = if let Ok(i) = text.parse::<i64>() {
            Value::from(i)
        } else {
            text.parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| format!("invalid number {text:?}"))?
        };
        Ok(Operand::Literal(number))
    }
}
