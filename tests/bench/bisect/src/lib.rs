//! drain-gate with its traffic role's per-stream counting switched off.
//!
//! The modules below are the real filter's source files; only the entry point
//! differs: the root, its configuration, its tick and the health role are the
//! real ones, but a traffic stream is the twin's structure (a boxed context
//! holding an `Rc` to the role's shared state, an in-VM counter bumped on
//! create and on `Drop`) instead of a counted `TrafficStream`. The benchmark
//! runs it beside the twin and drain-gate: twin → this is what the module,
//! root and ticks cost per request; this → drain-gate is what counting costs.

include!("../../../fixtures/src_modules.rs");

use host::traffic::Traffic;
use host::root::{Role, Root};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::Cell;
use std::rc::Rc;

struct BisectRoot {
    inner: Root,
    local: Rc<Cell<u64>>,
}

impl Context for BisectRoot {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        self.inner
            .on_http_call_response(token, headers, body, trailers);
    }
}

impl RootContext for BisectRoot {
    fn on_vm_start(&mut self, size: usize) -> bool {
        self.inner.on_vm_start(size)
    }

    fn on_configure(&mut self, size: usize) -> bool {
        self.inner.on_configure(size)
    }

    fn on_tick(&mut self) {
        self.inner.on_tick()
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        match &self.inner.role {
            Role::Traffic(traffic) => {
                self.local.set(self.local.get().wrapping_add(1));
                Some(Box::new(TwinStream {
                    _traffic: Rc::clone(traffic),
                    local: Rc::clone(&self.local),
                }))
            }
            _ => self.inner.create_http_context(context_id),
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        self.inner.get_type()
    }
}

struct TwinStream {
    _traffic: Rc<Traffic>,
    local: Rc<Cell<u64>>,
}

impl Context for TwinStream {}
impl HttpContext for TwinStream {}

impl Drop for TwinStream {
    fn drop(&mut self) {
        self.local.set(self.local.get().wrapping_sub(1));
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(BisectRoot { inner: Root::default(), local: Rc::new(Cell::new(0)) })
    });
}}
