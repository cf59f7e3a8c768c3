//! Golden files: every `testdata/launcher_spec/NAME.vmi.json` converts to exactly
//! `NAME.spec.json` (the launcher spec and the file actions) or fails with exactly
//! `NAME.error.txt`. The fixture's data directory appears as `$DATA` in both directions, so
//! inputs can name host disks and outputs hold no path of the machine that ran the test.
//! `UPDATE_GOLDEN=1` rewrites the expected files (the same variable as the launcher's argv
//! golden files).

use super::*;

const DATA: &str = "$DATA";

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/launcher_spec")
}

fn file_action_json(action: &FileAction) -> serde_json::Value {
    let p = |p: &Path| p.display().to_string();
    match action {
        FileAction::Copy { from, to } => {
            serde_json::json!({"copy": {"from": p(from), "to": p(to)}})
        }
        FileAction::Link { from, to } => {
            serde_json::json!({"link": {"from": p(from), "to": p(to)}})
        }
        FileAction::Share { from, to } => {
            serde_json::json!({"share": {"from": p(from), "to": p(to)}})
        }
        FileAction::Sparse { path, size } => {
            serde_json::json!({"sparse": {"path": p(path), "size": size}})
        }
        FileAction::Overlay {
            path,
            backing,
            backing_format,
        } => serde_json::json!({"overlay": {
            "path": p(path),
            "backing": p(backing),
            "backingFormat": backing_format,
        }}),
        FileAction::ConfigIso {
            path,
            label,
            source,
        } => serde_json::json!({"configIso": {
            "path": p(path),
            "label": label,
            "source": p(source),
        }}),
        FileAction::ConfigDrive { path, files } => serde_json::json!({"configDrive": {
            "path": p(path),
            "files": files.iter().map(|(n, c)| serde_json::json!({"name": n, "content": c})).collect::<Vec<_>>(),
        }}),
        FileAction::CloudInit { path, files } => serde_json::json!({"cloudInit": {
            "path": p(path),
            "files": files.iter().map(|(n, c)| serde_json::json!({"name": n, "content": c})).collect::<Vec<_>>(),
        }}),
    }
}

/// The pod interface of cases named `pod-network-*`: their launcher has its own network
/// namespace, so masquerade interfaces get the masquerade binding.
fn pod_interface() -> PodInterface {
    PodInterface {
        name: "eth0".into(),
        mac: "0a:58:0a:f5:00:07".into(),
        ip_addresses: vec!["10.245.0.7".into()],
        mtu: 1500,
    }
}

/// What a case produces: the expected file's name and its content.
fn render(f: &Fixture, case: &str, input: &str) -> Result<(&'static str, String), String> {
    let data = f.data.display().to_string();
    let vmi: VirtualMachineInstance =
        serde_json::from_str(&input.replace(DATA, &data)).map_err(|e| format!("bad VMI: {e}"))?;
    let pod = pod_interface();
    let mut ctx = f.ctx();
    if case.starts_with("pod-network-") {
        ctx.pod_interface = Some(&pod);
    }
    let (ext, text) = match build_spec(&vmi, &ctx) {
        Ok(prepared) => {
            let json = serde_json::json!({
                "spec": prepared.spec,
                "files": prepared.files.iter().map(file_action_json).collect::<Vec<_>>(),
            });
            ("spec.json", serde_json::to_string_pretty(&json).unwrap())
        }
        Err(e) => ("error.txt", format!("{}: {e}", e.reason())),
    };
    Ok((ext, text.replace(&data, DATA) + "\n"))
}

/// A line diff (longest common subsequence; the files are small), with three lines of
/// context around each change.
fn diff(expected: &str, actual: &str) -> String {
    const CONTEXT: usize = 3;
    let a: Vec<_> = expected.lines().collect();
    let b: Vec<_> = actual.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut lines) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push(format!("  {}", a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            lines.push(format!("- {}", a[i]));
            i += 1;
        } else {
            lines.push(format!("+ {}", b[j]));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..lines.len())
        .filter(|&k| !lines[k].starts_with(' '))
        .collect();
    let near = |k: usize| changed.iter().any(|&c| k.abs_diff(c) <= CONTEXT);
    let mut out = String::new();
    let mut skipped = false;
    for (k, line) in lines.iter().enumerate() {
        if near(k) {
            out += line;
            out.push('\n');
            skipped = false;
        } else if !skipped {
            out += "  …\n";
            skipped = true;
        }
    }
    out
}

#[test]
fn every_golden_vmi_converts_to_its_recorded_spec_or_error() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut cases: Vec<String> = std::fs::read_dir(testdata())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".vmi.json").map(str::to_owned)
        })
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases in {}", testdata().display());
    let mut failures = Vec::new();
    for case in &cases {
        let f = fixture();
        let input = std::fs::read_to_string(testdata().join(format!("{case}.vmi.json"))).unwrap();
        let (ext, actual) = match render(&f, case, &input) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{case}: {e}"));
                continue;
            }
        };
        let other = if ext == "spec.json" {
            "error.txt"
        } else {
            "spec.json"
        };
        let expected_path = testdata().join(format!("{case}.{ext}"));
        let other_path = testdata().join(format!("{case}.{other}"));
        if update {
            std::fs::write(&expected_path, &actual).unwrap();
            let _ = std::fs::remove_file(&other_path);
            continue;
        }
        if other_path.exists() {
            failures.push(format!(
                "{case}: {case}.{other} is recorded but the case produced {case}.{ext}:\n{actual}"
            ));
            continue;
        }
        match std::fs::read_to_string(&expected_path) {
            Err(_) => failures.push(format!("{case}: {case}.{ext} is missing; got:\n{actual}")),
            Ok(expected) if expected != actual => failures.push(format!(
                "{case}: {case}.{ext} differs (- recorded, + now):\n{}",
                diff(&expected, &actual)
            )),
            Ok(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden cases fail (UPDATE_GOLDEN=1 rewrites the expected files):\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_golden_diff_marks_removed_and_added_lines() {
    assert_eq!(diff("a\nb\nc\n", "a\nx\nc\n"), "  a\n- b\n+ x\n  c\n");
    assert_eq!(diff("a\n", "a\nb\n"), "  a\n+ b\n");
    let long = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
    assert_eq!(
        diff(long, &long.replace("5\n", "five\n")),
        "  …\n  2\n  3\n  4\n- 5\n+ five\n  6\n  7\n  8\n  …\n"
    );
}
