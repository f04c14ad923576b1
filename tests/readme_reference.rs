//! The README's configuration reference names every flag of every subcommand and every
//! OvercommitPolicy spec field: a new flag or field without documentation fails here.

use std::process::Command;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .unwrap_or_else(|e| panic!("reading README.md: {e}"))
}

/// Long flags listed in the Options section of `kube-overcommit <sub> --help`.
fn flags_of(subcommand: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kube-overcommit"))
        .args([subcommand, "--help"])
        .output()
        .unwrap_or_else(|e| panic!("running {subcommand} --help: {e}"));
    assert!(out.status.success(), "{subcommand} --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut flags: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("-h, ").unwrap_or(l);
            let l = l.split_once(", ").map_or(
                l,
                |(short, rest)| {
                    if short.len() == 2 { rest } else { l }
                },
            );
            let flag: String = l
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(format!("--{flag}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect();
    flags.dedup();
    flags
}

#[test]
fn readme_documents_every_flag() {
    let readme = readme();
    for sub in ["serve", "review", "rotate", "crd"] {
        let flags = flags_of(sub);
        if sub == "serve" {
            assert!(flags.len() > 20, "parsed too few serve flags: {flags:?}");
        }
        for flag in flags {
            assert!(
                readme.contains(&format!("`{flag}`"))
                    || readme.contains(&format!("{flag} "))
                    || readme.contains(&format!("[{flag}")),
                "README.md does not document `kube-overcommit {sub} {flag}`"
            );
        }
    }
}

#[test]
fn readme_documents_every_policy_field() {
    let readme = readme();
    let crd: serde_yaml::Value =
        serde_yaml::from_str(&overcommit_core::policy::crd_yaml().expect("CRD renders"))
            .expect("CRD is YAML");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let fields = spec.as_mapping().expect("spec has properties");
    assert!(fields.len() >= 4, "too few spec fields: {fields:?}");
    for (name, schema) in fields {
        let name = name.as_str().expect("field names are strings");
        let path = format!("spec.{name}");
        assert!(
            readme.contains(&format!("`{path}")),
            "README.md does not document {path}"
        );
        if name == "podDefaults" || name == "usage" {
            for (sub, _) in schema["properties"]
                .as_mapping()
                .expect("podDefaults and usage have properties")
            {
                let sub = format!("{path}.{}", sub.as_str().expect("string"));
                assert!(
                    readme.contains(&format!("`{sub}`")),
                    "README.md does not document {sub}"
                );
            }
        }
    }
}

/// The repository root (this crate's manifest directory).
fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The paths the "Where things are" table names in its second column: backticked, relative to
/// the root, or inside parentheses relative to the directory named just before them
/// (`src/leader/` (`rotation.rs`) names `src/leader/rotation.rs`).
fn table_paths(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## Where things are\n")
        .nth(1)
        .expect("README.md has a \"## Where things are\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut paths = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let Some(cell) = cells.get(1).map(|c| c.trim_end_matches(" |")) else {
            continue;
        };
        if cell == "where" || cell.starts_with("---") {
            continue;
        }
        let (mut depth, mut base, mut rest) = (0usize, String::new(), cell);
        while let Some(i) = rest.find(['`', '(', ')']) {
            match rest.as_bytes()[i] {
                b'(' => depth += 1,
                b')' => depth = depth.saturating_sub(1),
                _ => {
                    let after = &rest[i + 1..];
                    let end = after.find('`').expect("backticks are paired in the table");
                    let token = &after[..end];
                    if depth == 0 {
                        base = token.to_string();
                        paths.push(token.to_string());
                    } else {
                        paths.push(format!("{}{token}", base));
                    }
                    rest = &after[end + 1..];
                    continue;
                }
            }
            rest = &rest[i + 1..];
        }
    }
    paths
}

#[test]
fn readme_table_names_only_paths_that_exist() {
    let paths = table_paths(&readme());
    assert!(paths.len() > 60, "parsed too few paths: {paths:?}");
    let missing: Vec<&String> = paths.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "README.md's \"Where things are\" names paths that do not exist: {missing:?}"
    );
}

/// Entries that need no row of their own: generated or per-directory boilerplate.
const UNNAMED: &[&str] = &[
    "target",
    "Cargo.lock",
    "README.md",
    "go.mod",
    "go.sum",
    "__pycache__",
];

#[test]
fn readme_table_covers_the_tree() {
    let named = table_paths(&readme());
    let is_named = |path: &str| {
        named.iter().any(|n| {
            let n = n.trim_end_matches('/');
            n == path
                || n.starts_with(&format!("{path}/"))
                // a module directory goes with its module file (`src/status.rs`, `src/status/`)
                || n == format!("{path}.rs")
        })
    };
    let mut unnamed = Vec::new();
    for dir in [
        ".",
        "src",
        "core/src",
        "json/src",
        "tests",
        "tests/cluster",
        "deploy",
        "docs",
    ] {
        let entries =
            std::fs::read_dir(root().join(dir)).unwrap_or_else(|e| panic!("reading {dir}: {e}"));
        for entry in entries {
            let name = entry
                .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
                .file_name()
                .to_string_lossy()
                .into_owned();
            if name.starts_with('.') || UNNAMED.contains(&name.as_str()) {
                continue;
            }
            let path = if dir == "." {
                name
            } else {
                format!("{dir}/{name}")
            };
            if !is_named(&path) {
                unnamed.push(path);
            }
        }
    }
    unnamed.sort();
    assert!(
        unnamed.is_empty(),
        "README.md's \"Where things are\" does not name: {unnamed:?}"
    );
}

/// Where code and docs cite docs/architecture.md by rule ("docs/architecture.md rule 3.2") or
/// by section ("docs/architecture.md §6", "§5, §6"), the rule or section exists there.
#[test]
fn architecture_citations_exist() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md"))
        .unwrap_or_else(|e| panic!("reading docs/architecture.md: {e}"));
    let exists = |cite: &Cite| match cite {
        Cite::Rule(n) => doc.contains(&format!("\n### {n} ")),
        Cite::Section(n) => doc.contains(&format!("\n## {n}. ")),
    };
    let mut files = Vec::new();
    cited_files(&root(), &mut files);
    let mut cites = Vec::new();
    let mut wrong = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (i, _) in text.match_indices("architecture.md") {
            for cite in citations(&text[i + "architecture.md".len()..]) {
                if !exists(&cite) {
                    wrong.push(format!("{}: {cite:?}", file.display()));
                }
                cites.push(cite);
            }
        }
    }
    assert!(cites.len() >= 15, "found too few citations: {cites:?}");
    assert!(
        wrong.is_empty(),
        "cited but not in docs/architecture.md: {wrong:?}"
    );
}

#[derive(Debug)]
enum Cite {
    Rule(String),
    Section(String),
}

/// The citations right after a mention of the file (also across a comment's line break):
/// `rule N.M`, or `§N` repeated with `, ` or ` and ` between them.
fn citations(after: &str) -> Vec<Cite> {
    let rest = after.trim_start_matches(['`', ',', ' ', '\n', '/', '!', '#']);
    let number = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect::<String>()
            .trim_end_matches('.')
            .to_string()
    };
    if let Some(r) = rest.strip_prefix("rule ") {
        let n = number(r);
        return if n.is_empty() {
            vec![]
        } else {
            vec![Cite::Rule(n)]
        };
    }
    let mut out = Vec::new();
    let mut rest = rest;
    while let Some(r) = rest.strip_prefix('§') {
        let n = number(r);
        if n.is_empty() {
            break;
        }
        rest = r[n.len()..].trim_start_matches([',', ' ']);
        rest = rest.strip_prefix("and ").unwrap_or(rest);
        out.push(Cite::Section(n));
    }
    out
}

/// Source and documentation files of the repository, outside build output and hidden
/// directories.
fn cited_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "out" {
            continue;
        }
        if path.is_dir() {
            cited_files(&path, out);
        } else if ["rs", "go", "py", "md", "yaml", "sh", "tpl"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
            || name == "Makefile"
        {
            out.push(path);
        }
    }
}
