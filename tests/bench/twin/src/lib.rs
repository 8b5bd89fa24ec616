//! The no-op filter plus exactly drain-gate's per-stream structure: a boxed
//! stream context holding an `Rc` to state shared by the root context, and an
//! in-VM counter bumped when the stream is created and again in its `Drop`.
//! No host call. What this costs over the no-op filter is the cost of that
//! structure; what drain-gate costs over this is the cost of its own work.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::Cell;
use std::rc::Rc;

/// Shared by every stream of one root context (drain-gate's `Traffic`).
struct Shared {
    local: Cell<u64>,
}

struct Root(Rc<Shared>);

struct Stream {
    shared: Rc<Shared>,
}

impl Context for Root {}
impl RootContext for Root {
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        let shared = Rc::clone(&self.0);
        shared.local.set(shared.local.get().wrapping_add(1));
        Some(Box::new(Stream { shared }))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
impl Context for Stream {}
impl HttpContext for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        let local = &self.shared.local;
        local.set(local.get().wrapping_sub(1));
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root(Rc::new(Shared { local: Cell::new(0) })))
    });
}}
