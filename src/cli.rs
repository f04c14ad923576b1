//! Command line: `serve`, `review`, `rotate`, `crd`. Flags have env fallbacks.

pub fn main() -> anyhow::Result<()> {
    anyhow::bail!("not yet wired")
}
