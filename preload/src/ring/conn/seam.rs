//! Test-only: runs what a test put here on this thread right after a
//! ring read found nothing, to place the peer's moves in that window.

use std::cell::RefCell;

type Step = Box<dyn FnOnce()>;

thread_local! {
    static AFTER_EMPTY_LOOK: RefCell<Option<Step>> = const { RefCell::new(None) };
}

/// Runs `step` after this thread's next empty ring read.
pub fn after_empty_look_do(step: impl FnOnce() + 'static) {
    AFTER_EMPTY_LOOK.with(|s| *s.borrow_mut() = Some(Box::new(step)));
}

pub(super) fn after_empty_look() {
    if let Some(step) = AFTER_EMPTY_LOOK.with(|s| s.borrow_mut().take()) {
        step();
    }
}
