//! The committed AdmissionReview fixtures are exactly what tests/fixtures/generate.rs
//! produces. After changing the generator: `UPDATE_FIXTURES=1 cargo test --test fixtures`.

#[path = "fixtures/generate.rs"]
mod generate;

use std::path::PathBuf;

#[test]
fn fixtures_are_up_to_date() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let update = std::env::var_os("UPDATE_FIXTURES").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (name, contents) in generate::all() {
        let path = dir.join(name);
        if update {
            if let Err(e) = std::fs::write(&path, &contents) {
                panic!("cannot write {}: {e}", path.display());
            }
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == contents => {}
            Ok(_) => stale.push(format!("{name} differs")),
            Err(e) => stale.push(format!("{name}: {e}")),
        }
    }
    assert!(
        stale.is_empty(),
        "fixtures out of date ({}); run `UPDATE_FIXTURES=1 cargo test --test fixtures`",
        stale.join(", ")
    );
}

#[test]
fn fixtures_have_real_sizes() {
    // docs/architecture.md §11: a real node status review carries 50 images, managedFields and
    // conditions in both object and oldObject.
    let sizes: Vec<(&str, usize)> = generate::all().iter().map(|(n, c)| (*n, c.len())).collect();
    let size = |name: &str| {
        sizes
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .unwrap_or(0)
    };
    assert!(
        (40_000..80_000).contains(&size("node-status-update.json")),
        "{sizes:?}"
    );
    assert!(
        (180_000..260_000).contains(&size("node-status-update-large.json")),
        "{sizes:?}"
    );
    assert!(
        (3_000..8_000).contains(&size("pod-create.json")),
        "{sizes:?}"
    );
}
