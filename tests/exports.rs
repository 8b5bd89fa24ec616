//! The release build strips the exports of proxy-wasm callbacks drain-gate
//! does not implement (`UNUSED_CALLBACKS` in the Makefile): the host then never
//! calls into the VM for them. A context that starts implementing one of them
//! must take it off that list, or the host would never call it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::fs;

/// The SDK method behind each stripped export.
const METHODS: &[(&str, &str)] = &[
    ("proxy_on_grpc_", "fn on_grpc_"),
    ("proxy_on_foreign_function", "fn on_foreign_function"),
    ("proxy_on_queue_ready", "fn on_queue_ready"),
    ("proxy_on_request_body", "fn on_http_request_body"),
    ("proxy_on_request_trailers", "fn on_http_request_trailers"),
    ("proxy_on_new_connection", "fn on_new_connection"),
];

fn unused_callbacks() -> Vec<String> {
    let makefile = fs::read_to_string("Makefile").unwrap();
    let line = makefile
        .lines()
        .find_map(|l| l.strip_prefix("UNUSED_CALLBACKS := "))
        .expect("the Makefile lists UNUSED_CALLBACKS");
    line.split(',')
        .map(|s| s.trim().trim_end_matches('*').to_string())
        .collect()
}

#[test]
fn no_stripped_callback_is_implemented() {
    let listed = unused_callbacks();
    let mut sources = String::new();
    for dir in ["src", "src/host", "src/api"] {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                sources.push_str(&fs::read_to_string(&path).unwrap());
            }
        }
    }
    for export in &listed {
        let (_, method) = METHODS
            .iter()
            .find(|(e, _)| e == export)
            .unwrap_or_else(|| panic!("{export}: which SDK method is it? (add it to METHODS)"));
        assert!(
            !sources.contains(method),
            "`{method}` is implemented, but the Makefile strips {export}: the host would never call it"
        );
    }
    assert_eq!(
        listed.len(),
        METHODS.len(),
        "METHODS and UNUSED_CALLBACKS list the same exports"
    );
}
