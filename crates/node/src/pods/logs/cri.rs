//! Container logs in the CRI format, the one kubelet's container runtimes write: one entry
//! per line of output, `<time> <stream> <tag> <content>`, where `<time>` is RFC 3339 with
//! nanoseconds (when the line was read), `<stream>` is `stdout` or `stderr`, and `<tag>` is
//! `F` for a whole line or the last piece of one, `P` for a piece of a line longer than
//! [`MAX_LINE`] that the next entry of the stream continues. The time of each line is what
//! makes `timestamps=true` and a per-line `sinceTime`/`sinceSeconds` possible.
//!
//! Data flow: [`write_log`] copies a container's stdout and stderr (pipes) into its log
//! file, stamping each line as it arrives; the log endpoint reads the file back through
//! [`Lines`], which turns entries into the container's output (with the time in front for
//! `timestamps=true`) and drops those before `since`. A line not in this format (a log
//! written before, or straight from the container) is passed on as it is.
//!
//! # Caveats
//! The pod runner still hands each container its log file as stdout and stderr (the output
//! must outlive a restart of the node agent, so a writer between them has to be a process of
//! its own, as a container runtime's shim is); until it runs [`write_log`] in such a process,
//! its logs are raw lines.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

/// The longest piece of a line one entry holds (kubelet's limit).
pub const MAX_LINE: usize = 16 * 1024;

/// How much of a line without its newline [`Lines`] holds back before passing it on as it
/// is (an entry is at most [`MAX_LINE`] plus its header).
const MAX_PENDING: usize = MAX_LINE + 256;

/// One entry of a CRI log.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The time as written.
    pub time: &'a [u8],
    /// The time.
    pub at: SystemTime,
    /// `stdout` or `stderr`.
    pub stream: &'a [u8],
    /// A piece of a longer line (tag `P`): the content has no newline of its own.
    pub partial: bool,
    /// The line (without its newline).
    pub content: &'a [u8],
}

/// The entry `line` (without its newline) holds, or `None` if it is not one.
pub fn parse(line: &[u8]) -> Option<Entry<'_>> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let time = fields.next()?;
    let stream = fields.next()?;
    let tag = fields.next()?;
    let content = fields.next().unwrap_or_default();
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let partial = match tag {
        b"P" => true,
        b"F" => false,
        _ => return None,
    };
    let at: jiff::Timestamp = std::str::from_utf8(time).ok()?.parse().ok()?;
    Some(Entry {
        time,
        at: SystemTime::from(at),
        stream,
        partial,
        content,
    })
}

/// Whether `start`, a line whose newline has not been read yet, is or may become an entry.
fn may_be_entry(start: &[u8]) -> bool {
    let mut fields = start.splitn(4, |b| *b == b' ');
    let time = fields.next().unwrap_or_default();
    let Some(stream) = fields.next() else {
        return time.len() <= 40
            && time
                .iter()
                .all(|b| b.is_ascii_digit() || b"-:.TZ+".contains(b));
    };
    let valid_time = std::str::from_utf8(time)
        .ok()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .is_some();
    match (fields.next(), fields.next()) {
        (None, _) => valid_time && (b"stdout".starts_with(stream) || b"stderr".starts_with(stream)),
        (Some(tag), None) => {
            valid_time
                && (stream == b"stdout" || stream == b"stderr")
                && matches!(tag, b"" | b"F" | b"P")
        }
        (Some(_), Some(_)) => parse(start).is_some(),
    }
}

/// The entry for `content` of `stream` read at `at`, with its newline.
pub fn entry(at: jiff::Timestamp, stream: &str, partial: bool, content: &[u8]) -> Vec<u8> {
    let tag = if partial { 'P' } else { 'F' };
    let mut out = format!("{at} {stream} {tag} ").into_bytes();
    out.extend_from_slice(content);
    out.push(b'\n');
    out
}

/// Copies `stdout` and `stderr` into the CRI log at `log` (appending, created owner-only)
/// until both end, each line an entry stamped when it was read.
///
/// # Guarantees
/// Each entry is appended with one write, so entries of the two streams never interleave
/// within a line, and a copy-and-truncate rotation of the log loses no more than it would
/// of a container writing the file itself.
///
/// # Errors
/// The I/O error of opening the log, of a read or of a write (the other stream's copy
/// ends at its next line).
pub fn write_log(stdout: impl Read + Send, stderr: impl Read + Send, log: &Path) -> io::Result<()> {
    let file = Mutex::new(private_fs::open_append(log)?);
    std::thread::scope(|scope| {
        let out = scope.spawn(|| copy_stream(stdout, "stdout", &file));
        let err = copy_stream(stderr, "stderr", &file);
        let out = out
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the stdout copy panicked")));
        out.and(err)
    })
}

/// Copies one stream into `to`, an entry per line (or per [`MAX_LINE`] piece of a longer one).
fn copy_stream(mut from: impl Read, stream: &str, to: &Mutex<std::fs::File>) -> io::Result<()> {
    let append = |partial: bool, content: &[u8]| -> io::Result<()> {
        let bytes = entry(jiff::Timestamp::now(), stream, partial, content);
        let mut file = to
            .lock()
            .map_err(|_| io::Error::other("the log file's lock is poisoned"))?;
        file.write_all(&bytes)
    };
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let room = MAX_LINE - line.len();
            let take = rest.len().min(room);
            if let Some(newline) = rest[..take].iter().position(|b| *b == b'\n') {
                line.extend_from_slice(&rest[..newline]);
                append(false, &line)?;
                line.clear();
                rest = &rest[newline + 1..];
            } else {
                line.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if line.len() == MAX_LINE {
                    append(true, &line)?;
                    line.clear();
                }
            }
        }
    }
    if !line.is_empty() {
        append(false, &line)?;
    }
    Ok(())
}

/// Turns the bytes of a log, as they are read, into what the log endpoint answers: the
/// content of each entry (after its time and a space for `timestamps`), nothing of an entry
/// before `since`, and every line that is no entry as it is.
#[derive(Debug, Default)]
pub struct Lines {
    since: Option<SystemTime>,
    timestamps: bool,
    /// The start of a line whose newline has not been read yet.
    pending: Vec<u8>,
}

impl Lines {
    pub fn new(since: Option<SystemTime>, timestamps: bool) -> Lines {
        Lines {
            since,
            timestamps,
            pending: Vec::new(),
        }
    }

    /// Forgets a line begun before the log was rotated.
    pub fn reset(&mut self) {
        self.pending.clear();
    }

    /// Adds `bytes` read from the log to `out`, as answered.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) {
        while let Some(newline) = bytes.iter().position(|b| *b == b'\n') {
            if self.pending.is_empty() {
                self.emit(&bytes[..=newline], out);
            } else {
                self.pending.extend_from_slice(&bytes[..=newline]);
                let line = std::mem::take(&mut self.pending);
                self.emit(&line, out);
            }
            bytes = &bytes[newline + 1..];
        }
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > MAX_PENDING {
            // Too long for an entry: raw output, passed on as it is.
            out.append(&mut self.pending);
        }
    }

    /// Passes on the line without a newline read last: at the end of the answer
    /// (`end`), or, while following, when it is no entry (raw output that has not ended its
    /// line yet); an entry still being written waits for its newline.
    pub fn flush(&mut self, end: bool, out: &mut Vec<u8>) {
        if self.pending.is_empty() || (!end && may_be_entry(&self.pending)) {
            return;
        }
        let line = std::mem::take(&mut self.pending);
        self.emit(&line, out);
    }

    /// Adds one line (with its newline, if it had one) to `out`.
    fn emit(&self, line: &[u8], out: &mut Vec<u8>) {
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let Some(entry) = parse(text) else {
            out.extend_from_slice(line);
            return;
        };
        if self.since.is_some_and(|since| entry.at < since) {
            return;
        }
        if self.timestamps {
            out.extend_from_slice(entry.time);
            out.push(b' ');
        }
        out.extend_from_slice(entry.content);
        if !entry.partial {
            out.push(b'\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T1: &str = "2026-01-02T03:04:05.000000001Z";
    const T2: &str = "2026-01-02T03:04:06.5Z";

    fn answer(lines: &mut Lines, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in chunks {
            lines.feed(chunk, &mut out);
        }
        lines.flush(true, &mut out);
        out
    }

    #[test]
    fn entries_are_parsed_and_other_lines_are_not() {
        let e = parse(format!("{T1} stderr P half").as_bytes()).map(|e| {
            (
                e.stream.to_vec(),
                e.partial,
                e.content.to_vec(),
                e.time.to_vec(),
            )
        });
        assert_eq!(
            e,
            Some((
                b"stderr".to_vec(),
                true,
                b"half".to_vec(),
                T1.as_bytes().to_vec()
            ))
        );
        assert_eq!(
            parse(format!("{T1} stdout F ").as_bytes()).map(|e| e.content.len()),
            Some(0)
        );
        for raw in [
            "plain output".to_owned(),
            format!("{T1} stdin F x"),
            format!("{T1} stdout X x"),
            "yesterday stdout F x".to_owned(),
            String::new(),
        ] {
            assert_eq!(parse(raw.as_bytes()), None, "{raw:?}");
        }
    }

    #[test]
    fn entries_become_their_content_with_or_without_their_time() {
        let log = format!("{T1} stdout F first\n{T2} stderr P long \n{T2} stderr F line\nraw\n");
        let plain = answer(&mut Lines::new(None, false), &[log.as_bytes()]);
        assert_eq!(plain, b"first\nlong line\nraw\n");
        let stamped = answer(&mut Lines::new(None, true), &[log.as_bytes()]);
        assert_eq!(
            String::from_utf8(stamped).unwrap(),
            format!("{T1} first\n{T2} long {T2} line\nraw\n")
        );
    }

    #[test]
    fn since_drops_the_entries_before_it_line_by_line() {
        let log = format!("{T1} stdout F early\n{T2} stdout F late\n");
        let t2: jiff::Timestamp = T2.parse().unwrap();
        let since = SystemTime::from(t2);
        let out = answer(&mut Lines::new(Some(since), false), &[log.as_bytes()]);
        assert_eq!(out, b"late\n");
        let later = since + Duration::from_millis(1);
        let out = answer(&mut Lines::new(Some(later), false), &[log.as_bytes()]);
        assert_eq!(out, b"");
    }

    #[test]
    fn a_line_split_across_reads_is_answered_once_whole() {
        let log = format!("{T1} stdout F across reads\n");
        for at in 1..log.len() {
            let (a, b) = log.as_bytes().split_at(at);
            let mut lines = Lines::new(None, false);
            let mut out = Vec::new();
            lines.feed(a, &mut out);
            lines.flush(false, &mut out);
            assert_eq!(
                out, b"",
                "an entry being written waits for its newline ({at})"
            );
            lines.feed(b, &mut out);
            assert_eq!(out, b"across reads\n");
        }
        let mut lines = Lines::new(None, false);
        // Raw output without a newline is passed on while following.
        let mut out = Vec::new();
        lines.feed(b"prompt: ", &mut out);
        lines.flush(false, &mut out);
        assert_eq!(out, b"prompt: ");
    }

    #[test]
    fn the_writer_stamps_each_line_of_both_streams_and_splits_long_ones() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("c.log");
        let long = "y".repeat(MAX_LINE + 10);
        let stdout = format!("one\ntwo\n{long}\nlast without newline");
        let before = SystemTime::now();
        write_log(stdout.as_bytes(), &b"oops\n"[..], &log).unwrap();
        let text = std::fs::read(&log).unwrap();
        let entries: Vec<Entry<'_>> = text
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| parse(l).expect("an entry"))
            .collect();
        let of = |stream: &[u8]| -> Vec<(bool, Vec<u8>)> {
            entries
                .iter()
                .filter(|e| e.stream == stream)
                .map(|e| (e.partial, e.content.to_vec()))
                .collect()
        };
        assert_eq!(
            of(b"stdout"),
            [
                (false, b"one".to_vec()),
                (false, b"two".to_vec()),
                (true, long.as_bytes()[..MAX_LINE].to_vec()),
                (false, b"yyyyyyyyyy".to_vec()),
                (false, b"last without newline".to_vec()),
            ]
        );
        assert_eq!(of(b"stderr"), [(false, b"oops".to_vec())]);
        let after = SystemTime::now();
        assert!(entries.iter().all(|e| before <= e.at && e.at <= after));
        // Read back, the output is the container's (the streams' lines may interleave).
        let answered = String::from_utf8(answer(&mut Lines::new(None, false), &[&text])).unwrap();
        assert_eq!(answered.replacen("oops\n", "", 1), format!("{stdout}\n"));
    }
}
