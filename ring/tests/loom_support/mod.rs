//! What the loom models share (each `tests/loom*.rs` is its own crate and
//! includes this with `mod loom_support;`).

/// Explores `f` under loom with a preemption bound of 3: every model here
/// stays small enough for that to be exhaustive in CI time.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}
