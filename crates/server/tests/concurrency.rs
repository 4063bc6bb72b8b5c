//! Many sandboxes at once: 64 created, exec'd and removed from 16 threads against one
//! daemon; every result is checked and nothing is left on the host.

mod common;

use common::*;
use hyper::{Method, StatusCode};
use serde_json::json;

const THREADS: usize = 16;
const PER_THREAD: usize = 4;

fn worker(d: &TestDaemon, t: usize) -> Vec<String> {
    let c = d.client();
    let ids: Vec<String> = (0..PER_THREAD)
        .map(|i| d.create(json!({"memory_mb": 64, "env": {"TAG": format!("{t}-{i}")}})))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let v = d.sh(id, "echo $TAG; echo $TAG > /root/tag; cat /root/tag >&2");
        let want = format!("{t}-{i}\n");
        assert_eq!(
            (v["stdout"].as_str(), v["stderr"].as_str()),
            (Some(want.as_str()), Some(want.as_str())),
            "{id}: {v}"
        );
    }
    for id in &ids {
        let (s, v) = c.json(Method::DELETE, &format!("/v1/sandboxes/{id}"), None);
        assert_eq!(
            (s, v["state"].as_str()),
            (StatusCode::OK, Some("terminated")),
            "{v}"
        );
    }
    ids
}

#[test]
fn sixty_four_sandboxes_from_sixteen_threads() {
    let d = TestDaemon::with(|c| c.max_sandboxes = 128);
    d.create(json!({})); // Builds the default image once, before the rush.
    let started = std::time::Instant::now();
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let d = &d;
                s.spawn(move || worker(d, t))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    eprintln!("{} sandboxes in {:?}", ids.len(), started.elapsed());
    assert_eq!(ids.len(), THREADS * PER_THREAD);
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "ids are unique");
    for id in &ids {
        let left = host_traces(&d.data, id);
        assert!(left.is_empty(), "{id}: {left:?}");
    }
    let (_, list) = d.client().get("/v1/sandboxes");
    assert_eq!(
        list["sandboxes"].as_array().unwrap().len(),
        1,
        "only the warm-up sandbox"
    );
    assert!(
        processes_mentioning(&d.data.join("store").to_string_lossy()).len() <= 1,
        "one disk server left (the warm-up sandbox's)"
    );
}
