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
