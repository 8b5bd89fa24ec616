//! Traffic role: counts every HTTP stream of the listener it is inserted in,
//! and flips DRAINING → CLOSING from the callback that ends the last one.

use proxy_wasm::traits::{Context, HttpContext};
use std::rc::Rc;

use super::count::Counter;
use super::metrics::Metrics;
use super::store;

/// Shared by every stream of one traffic root context.
#[derive(Debug)]
pub struct Traffic {
    pub counter: Counter,
    pub metrics: Metrics,
}

impl Traffic {
    fn stream_ended(&self) {
        if self.counter.exit() > 0 {
            return; // this VM still holds streams: the global count is not 0
        }
        let reading = self.counter.read();
        if reading.for_decisions() > 0 {
            return;
        }
        if let Err(e) = store::apply_due(0, None, &self.metrics) {
            log::error!("event=state_unavailable role=traffic error=\"{e}\"");
        }
    }
}

/// One HTTP stream. It is counted from creation, whether or not its headers
/// callback ever runs (an earlier filter may answer locally), and released in
/// `Drop`, which the host runs for every stream end, resets included.
pub struct TrafficStream {
    traffic: Rc<Traffic>,
    counted: bool,
}

impl TrafficStream {
    pub fn new(traffic: Rc<Traffic>) -> TrafficStream {
        let counted = traffic.counter.enter(&traffic.metrics);
        TrafficStream { traffic, counted }
    }
}

impl Context for TrafficStream {}

impl HttpContext for TrafficStream {}

impl Drop for TrafficStream {
    fn drop(&mut self) {
        if self.counted {
            self.traffic.stream_ended();
        }
    }
}
