//! The real `kube-overcommit serve` binary over real TLS: protocol versions and HTTP/2,
//! certificate hot-reload through a kubelet-style `..data` swap, bad certificates, bad
//! requests, slow clients, TLS garbage, SIGTERM, and (ignored: make test-e2e) hostile clients
//! against the memory budget.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn leaf_pair() -> (Pki, Leaf) {
    let pki = Pki::new();
    let leaf = pki.leaf("leaf-1");
    (pki, leaf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_tls13_and_alpn_negotiate() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &["--http2", "--tls-min-version=1.2"]);
    w.wait_ready().await;
    for (version, want) in [
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
    ] {
        for (alpn, want_alpn) in [(&b"h2"[..], &b"h2"[..]), (b"http/1.1", b"http/1.1")] {
            let cfg = client_config(pki.ca_der(), &[version], &[alpn]);
            let s = tls_connect(w.webhook, cfg).await.expect("handshake");
            let (_, conn) = s.get_ref();
            assert_eq!(conn.protocol_version(), Some(want));
            assert_eq!(conn.alpn_protocol(), Some(want_alpn));
            assert_eq!(
                conn.peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.to_vec()),
                Some(leaf.cert_der.clone())
            );
        }
    }
    // A client that trusts another CA fails the handshake.
    let other = Pki::new();
    assert!(peer_leaf(w.webhook, other.ca_der()).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_only_tls13_and_http1_are_offered() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &[]);
    w.wait_ready().await;
    let tls13 = [&rustls::version::TLS13];
    let tls12 = [&rustls::version::TLS12];
    // TLS 1.2 is refused.
    let cfg = client_config(pki.ca_der(), &tls12, &[b"http/1.1"]);
    assert!(
        tls_connect(w.webhook, cfg).await.is_err(),
        "TLS 1.2 accepted"
    );
    // A client offering h2 and http/1.1 gets http/1.1; one offering only h2 is refused.
    let cfg = client_config(pki.ca_der(), &tls13, &[b"h2", b"http/1.1"]);
    let s = tls_connect(w.webhook, cfg).await.expect("handshake");
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(
        s.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    let cfg = client_config(pki.ca_der(), &tls13, &[b"h2"]);
    assert!(tls_connect(w.webhook, cfg).await.is_err(), "h2 negotiated");
    // HTTP/2 with prior knowledge over http/1.1 is not served either.
    let c = client_for(&w, pki.ca_der(), true);
    assert!(
        c.post(url(&w, "/mutate"))
            .json(&node_review("h2", "4"))
            .send()
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_must_send_a_request_within_the_header_timeout() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(
        &leaf,
        &["--http2", "--header-read-timeout=1s", "--idle-timeout=60s"],
    );
    w.wait_ready().await;
    let cfg = || client_config(pki.ca_der(), &all_versions(), &[b"h2"]);
    // The connection preface and part of a frame, then nothing: cut off after ~1 s.
    let mut s = tls_connect(w.webhook, cfg()).await.expect("tls");
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let started = Instant::now();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00")
        .await
        .expect("write");
    assert!(
        closed_within(&mut s, Duration::from_secs(5)).await,
        "a silent HTTP/2 connection was kept past the header timeout"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // A connection whose first request came in time stays open past it (idle timeout 60 s).
    let c = client_for(&w, pki.ca_der(), true);
    for i in 0..2 {
        let r = c
            .post(url(&w, "/mutate"))
            .json(&node_review(&format!("h2-{i}"), "4"))
            .send()
            .await
            .expect("send");
        assert_eq!(r.version(), http::Version::HTTP_2);
        assert_eq!(r.status(), 200);
        if i == 0 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
    assert_eq!(
        metric_value(&w.metrics().await, "kube_overcommit_open_connections"),
        1.0,
        "the HTTP/2 connection was not reused after the header timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_over_http1_keepalive_and_http2() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &["--http2"]);
    w.wait_ready().await;
    for http2 in [false, true] {
        let client = client_for(&w, pki.ca_der(), http2);
        for i in 0..3 {
            let uid = format!("uid-{http2}-{i}");
            let resp = client
                .post(url(&w, "/mutate?timeout=2s"))
                .json(&node_review(&uid, "4"))
                .send()
                .await
                .expect("request");
            let version = resp.version();
            assert_eq!(
                version,
                if http2 {
                    http::Version::HTTP_2
                } else {
                    http::Version::HTTP_11
                }
            );
            assert_eq!(resp.status(), 200);
            let v: serde_json::Value = resp.json().await.expect("json");
            assert_eq!(v["kind"], "AdmissionReview");
            assert_eq!(v["response"]["uid"], uid.as_str());
            assert_eq!(v["response"]["allowed"], true);
            assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");
            let patch = base64_decode(v["response"]["patch"].as_str().expect("patch"));
            let patch: serde_json::Value = serde_json::from_slice(&patch).expect("patch json");
            let cpu = patch
                .as_array()
                .and_then(|ops| {
                    ops.iter()
                        .find(|op| op["path"] == "/status/allocatable/cpu")
                })
                .unwrap_or_else(|| panic!("no allocatable cpu op: {patch}"));
            assert!(
                cpu["value"] == "8" || cpu["value"] == "8000m",
                "4 cpus x 2 = 8: {cpu}"
            );
        }
    }
    let m = w.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            r#"kube_overcommit_reviews_total{resource="node",operation="UPDATE",outcome="patched"}"#
        ),
        6.0,
        "{m}"
    );
    assert!(metric_value(&m, "kube_overcommit_review_duration_seconds_count") >= 6.0);
    assert_eq!(
        metric_value(&m, "kube_overcommit_policies_loaded"),
        1.0,
        "{m}"
    );
    assert!(metric_value(&m, "kube_overcommit_certificate_not_after_seconds") > 1.7e9);
    // One TCP connection per protocol: keep-alive and HTTP/2 multiplexing reuse it.
    assert!(m.contains("kube_overcommit_build_info"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_data_swap_reaches_new_connections() {
    let (pki, leaf1) = leaf_pair();
    let w = Webhook::start(&leaf1, &[]);
    w.wait_ready().await;
    assert_eq!(
        peer_leaf(w.webhook, pki.ca_der()).await,
        Some(leaf1.cert_der.clone())
    );

    for n in 2..=3 {
        let next = pki.leaf(&format!("leaf-{n}"));
        let swapped = Instant::now();
        write_leaf(&w.tls_dir, &next);
        let ok = wait_until(Duration::from_secs(5), || async {
            peer_leaf(w.webhook, pki.ca_der()).await == Some(next.cert_der.clone())
        })
        .await;
        assert!(
            ok,
            "new connections did not get leaf-{n}; logs:\n{}",
            w.logs()
        );
        let took = swapped.elapsed();
        eprintln!("leaf-{n} served {took:?} after the ..data swap");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }
    let m = w.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            r#"kube_overcommit_certificate_reloads_total{result="success"}"#
        ),
        3.0,
        "{m}"
    );
    assert_eq!(w.probe("/readyz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_reread_picks_up_a_swap_without_notifications() {
    let (pki, leaf1) = leaf_pair();
    let w = Webhook::start(&leaf1, &["--no-file-watch", "--cert-reload-interval=300ms"]);
    w.wait_ready().await;
    let next = pki.leaf("leaf-polled");
    write_leaf(&w.tls_dir, &next);
    let ok = wait_until(Duration::from_secs(5), || async {
        peer_leaf(w.webhook, pki.ca_der()).await == Some(next.cert_der.clone())
    })
    .await;
    assert!(
        ok,
        "periodic re-read did not pick up the new pair; logs:\n{}",
        w.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_or_mismatched_pairs_keep_the_last_good_one() {
    let (pki, good) = leaf_pair();
    let w = Webhook::start(&good, &[]);
    w.wait_ready().await;
    let other = pki.leaf("other");
    let truncated_cert = &good.cert_pem.as_bytes()[..good.cert_pem.len() / 2];
    let truncated_key = &good.key_pem.as_bytes()[..good.key_pem.len() / 2];
    let cases: Vec<(&str, &[u8], &[u8])> = vec![
        (
            "truncated certificate",
            truncated_cert,
            good.key_pem.as_bytes(),
        ),
        ("truncated key", good.cert_pem.as_bytes(), truncated_key),
        (
            "key of another certificate",
            other.cert_pem.as_bytes(),
            good.key_pem.as_bytes(),
        ),
        ("garbage", b"\x00\x01garbage", b"not a key"),
        ("empty files", b"", b""),
    ];
    let errors = |m: &str| {
        metric_value(
            m,
            r#"kube_overcommit_certificate_reloads_total{result="error"}"#,
        )
    };
    for (i, (name, cert, key)) in cases.into_iter().enumerate() {
        kubelet_write(&w.tls_dir, &[("tls.crt", cert), ("tls.key", key)]);
        let want = (i + 1) as f64;
        let counted = wait_until(Duration::from_secs(5), || async {
            errors(&w.metrics().await) >= want
        })
        .await;
        assert!(counted, "{name}: refusal not counted; logs:\n{}", w.logs());
        assert_eq!(
            peer_leaf(w.webhook, pki.ca_der()).await,
            Some(good.cert_der.clone()),
            "{name}: the last good certificate must keep serving"
        );
        assert_eq!(w.probe("/readyz").await.0, 200, "{name}");
    }
    let logs = w.logs();
    assert!(logs.contains("TLS pair refused"), "{logs}");
    assert!(!logs.contains("PRIVATE KEY"), "key material in logs");
    // A good pair after the bad ones is picked up.
    let next = pki.leaf("after-bad");
    write_leaf(&w.tls_dir, &next);
    let ok = wait_until(Duration::from_secs(5), || async {
        peer_leaf(w.webhook, pki.ca_der()).await == Some(next.cert_der.clone())
    })
    .await;
    assert!(ok, "good pair after bad ones not served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_without_a_certificate_and_becomes_ready_when_one_appears() {
    let (pki, leaf) = leaf_pair();
    // A fresh replica whose TLS directory is still empty (the Secret is not written yet).
    let w2 = Webhook::start_with(None, &[]);
    let tls = w2.tls_dir.clone();
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let (code, body) = w2.probe("/readyz").await;
            if code == 503 && body.contains("certificate") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("readyz must name the missing certificate");
    assert!(peer_leaf(w2.webhook, pki.ca_der()).await.is_none());
    write_leaf(&tls, &leaf);
    w2.wait_ready().await;
    assert_eq!(
        peer_leaf(w2.webhook, pki.ca_der()).await,
        Some(leaf.cert_der.clone())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_answers() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &[]);
    w.wait_ready().await;
    let c = client_for(&w, pki.ca_der(), false);

    let r = c
        .post(url(&w, "/mutate"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
    assert!(
        !r.text().await.expect("body").is_empty(),
        "400 must say why"
    );

    let r = c.get(url(&w, "/mutate")).send().await.expect("send");
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");

    let r = c
        .post(url(&w, "/mutate"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 415);

    let r = c
        .post(url(&w, "/mutate"))
        .header("content-type", "application/json; charset=utf-8")
        .json(&node_review("ct-params", "4"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200, "content type parameters are allowed");

    let r = c
        .post(url(&w, "/validate"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 404);

    // An 8 MiB review is accepted (a node with a huge annotation).
    let mut big = node_review("big", "4");
    big["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"example.com/padding": "x".repeat(8 * 1024 * 1024)});
    let body = serde_json::to_vec(&big).expect("json");
    assert!(body.len() > 8 * 1024 * 1024);
    let r = c
        .post(url(&w, "/mutate"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["response"]["allowed"], true);

    // Over the limit by Content-Length: refused before the body is read.
    let limit = 16 * 1024 * 1024;
    let mut s = tls_connect(
        w.webhook,
        client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]),
    )
    .await
    .expect("tls");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        limit + 1
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let r = read_response(&mut s).await.expect("response");
    assert_eq!(r.status, 413, "{}", r.head);

    // Over the limit while streaming (chunked, no Content-Length).
    let mut s = tls_connect(
        w.webhook,
        client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]),
    )
    .await
    .expect("tls");
    s.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .expect("write");
    let chunk = vec![b' '; 1024 * 1024];
    let mut sent = 0;
    let (mut rd, mut wr) = tokio::io::split(s);
    let writer = tokio::spawn(async move {
        while sent <= limit {
            let framed = [
                format!("{:x}\r\n", chunk.len()).into_bytes(),
                chunk.clone(),
                b"\r\n".to_vec(),
            ]
            .concat();
            if wr.write_all(&framed).await.is_err() {
                return;
            }
            sent += chunk.len();
        }
    });
    let r = tokio::time::timeout(Duration::from_secs(20), read_response(&mut rd))
        .await
        .expect("answer in time")
        .expect("response");
    assert_eq!(r.status, 413, "{}", r.head);
    writer.abort();

    let m = w.metrics().await;
    for status in [404, 405, 413, 415] {
        assert!(
            metric_value(
                &m,
                &format!(r#"kube_overcommit_http_rejects_total{{status="{status}"}}"#)
            ) >= 1.0,
            "{status} not counted: {m}"
        );
    }
    assert!(
        metric_value(
            &m,
            r#"kube_overcommit_reviews_total{resource="other",operation="none",outcome="bad_request"}"#
        ) >= 1.0,
        "{m}"
    );
    // Still serving.
    let r = c
        .post(url(&w, "/mutate"))
        .json(&node_review("after", "4"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_disconnected() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(
        &leaf,
        &[
            "--header-read-timeout=1s",
            "--tls-handshake-timeout=1s",
            "--body-read-timeout=1s",
        ],
    );
    w.wait_ready().await;

    // Headers sent slowly, never finished.
    let mut s = tls_connect(
        w.webhook,
        client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]),
    )
    .await
    .expect("tls");
    let started = Instant::now();
    s.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("write");
    let closed = closed_within(&mut s, Duration::from_secs(5)).await;
    assert!(closed, "slow headers must be cut off");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );

    // A TCP connection that never starts the TLS handshake.
    let mut tcp = TcpStream::connect(w.webhook).await.expect("tcp");
    assert!(
        closed_within(&mut tcp, Duration::from_secs(5)).await,
        "silent TCP must be cut off"
    );

    // A body that never completes gets 408 and the connection ends.
    let mut s = tls_connect(
        w.webhook,
        client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]),
    )
    .await
    .expect("tls");
    s.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .expect("write");
    let r = tokio::time::timeout(Duration::from_secs(5), read_response(&mut s))
        .await
        .expect("answer in time")
        .expect("response");
    assert_eq!(r.status, 408);

    assert!(
        metric_value(
            &w.metrics().await,
            "kube_overcommit_tls_handshake_failures_total"
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_garbage_does_not_hurt() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &[]);
    w.wait_ready().await;
    let payloads: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0x16, 0x03, 0x01, 0xff, 0xff, 0x01, 0x00],
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect(),
        vec![0u8; 100_000],
    ];
    for p in &payloads {
        let mut tcp = TcpStream::connect(w.webhook).await.expect("tcp");
        let _ = tcp.write_all(p).await;
        assert!(closed_within(&mut tcp, Duration::from_secs(5)).await);
    }
    let c = client_for(&w, pki.ca_der(), false);
    let r = c
        .post(url(&w, "/mutate"))
        .json(&node_review("after-garbage", "4"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert!(w.probe("/readyz").await.0 == 200);
    let failures = metric_value(
        &w.metrics().await,
        "kube_overcommit_tls_handshake_failures_total",
    );
    assert!(failures >= payloads.len() as f64, "{failures}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_unready_at_once_finishes_in_flight_and_exits() {
    let (pki, leaf) = leaf_pair();
    let mut w = Webhook::start(&leaf, &["--shutdown-grace=10s", "--body-read-timeout=30s"]);
    w.wait_ready().await;
    let cfg = || client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]);

    // An idle keep-alive connection (one request done).
    let mut idle = tls_connect(w.webhook, cfg()).await.expect("tls");
    let body = serde_json::to_vec(&node_review("idle", "4")).expect("json");
    let req = [
        format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes(),
        body.clone(),
    ]
    .concat();
    idle.write_all(&req).await.expect("write");
    assert_eq!(
        read_response(&mut idle).await.expect("response").status,
        200
    );

    // A request in flight: headers and half of the body sent.
    let mut busy = tls_connect(w.webhook, cfg()).await.expect("tls");
    let body = serde_json::to_vec(&node_review("in-flight", "4")).expect("json");
    let (first, rest) = body.split_at(body.len() / 2);
    busy.write_all(
        format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
    )
    .await
    .expect("write");
    busy.write_all(first).await.expect("write");
    busy.flush().await.expect("flush");
    // Make sure the server has the request before the signal.
    tokio::time::timeout(Duration::from_secs(5), async {
        while metric_value(&w.metrics().await, "kube_overcommit_open_connections") < 2.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("connections open");

    let signalled = Instant::now();
    w.signal("TERM");
    let unready = wait_until(Duration::from_secs(2), || async {
        w.probe("/readyz").await.0 == 503
    })
    .await;
    assert!(unready, "readyz must fail at once");
    let (_, why) = w.probe("/readyz").await;
    assert!(why.contains("not-shutting-down"), "{why}");
    eprintln!("unready {:?} after SIGTERM", signalled.elapsed());

    // The idle keep-alive connection is closed gracefully.
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "idle connection not closed"
    );

    // The in-flight request completes.
    busy.write_all(rest).await.expect("write rest");
    let r = read_response(&mut busy).await.expect("in-flight response");
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["response"]["uid"], "in-flight");
    assert!(
        r.head.to_ascii_lowercase().contains("connection: close"),
        "{}",
        r.head
    );

    // The process exits, well within the grace period, with success.
    let status = wait_exit(&mut w, Duration::from_secs(10))
        .await
        .expect("exited within grace");
    assert!(status.success(), "{status:?}\n{}", w.logs());
    assert!(signalled.elapsed() < Duration::from_secs(10));
}

/// During --shutdown-delay the replica still serves, but retires HTTP/1.1 keep-alive
/// connections: each response says `Connection: close` and the connection ends after it, so a
/// client's next request goes on a new connection (to another replica, once the endpoints have
/// moved) instead of racing the drain's close of an idle connection (an EOF the API server does
/// not retry for a webhook POST).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_shutdown_delay_keepalive_connections_are_retired() {
    let (pki, leaf) = leaf_pair();
    let mut w = Webhook::start(&leaf, &["--shutdown-grace=20s", "--shutdown-delay=4s"]);
    w.wait_ready().await;
    let cfg = || client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]);
    let request = |uid: &str| {
        let body = serde_json::to_vec(&node_review(uid, "4")).expect("json");
        [
            format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes(),
            body,
        ]
        .concat()
    };
    let closes = |head: &str| head.to_ascii_lowercase().contains("connection: close");

    // Before the signal: keep-alive.
    let mut conn = tls_connect(w.webhook, cfg()).await.expect("tls");
    conn.write_all(&request("before")).await.expect("write");
    let r = read_response(&mut conn).await.expect("response");
    assert_eq!(r.status, 200);
    assert!(!closes(&r.head), "{}", r.head);

    let signalled = Instant::now();
    w.signal("TERM");
    assert!(
        wait_until(Duration::from_secs(2), || async {
            w.probe("/readyz").await.0 == 503
        })
        .await
    );
    // Within the delay: the same connection is served once more, told to close, and closed.
    conn.write_all(&request("retiring")).await.expect("write");
    let r = read_response(&mut conn)
        .await
        .expect("response while retiring");
    assert_eq!(r.status, 200);
    assert!(closes(&r.head), "{}", r.head);
    assert!(
        closed_within(&mut conn, Duration::from_secs(2)).await,
        "the retired connection was not closed after its response"
    );
    // A new connection within the delay is still accepted, and retired the same way.
    let mut late = tls_connect(w.webhook, cfg())
        .await
        .expect("tls within the delay");
    late.write_all(&request("late")).await.expect("write");
    let r = read_response(&mut late).await.expect("response");
    assert_eq!(r.status, 200);
    assert!(closes(&r.head), "{}", r.head);
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "the checks above must run within the delay: {:?}",
        signalled.elapsed()
    );
    let status = wait_exit(&mut w, Duration::from_secs(15))
        .await
        .expect("exited within grace");
    assert!(status.success(), "{status:?}\n{}", w.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_period_bounds_shutdown_and_second_signal_aborts() {
    let (pki, leaf) = leaf_pair();
    let cfg = || client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]);
    let stuck_request = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{";

    // A request that never completes: the grace period ends the process anyway.
    let mut w = Webhook::start(&leaf, &["--shutdown-grace=2s", "--body-read-timeout=60s"]);
    w.wait_ready().await;
    let mut stuck = tls_connect(w.webhook, cfg()).await.expect("tls");
    stuck.write_all(stuck_request).await.expect("write");
    stuck.flush().await.expect("flush");
    wait_until(Duration::from_secs(5), || async {
        metric_value(&w.metrics().await, "kube_overcommit_open_connections") >= 1.0
    })
    .await;
    let t = Instant::now();
    w.signal("TERM");
    wait_exit(&mut w, Duration::from_secs(5))
        .await
        .expect("exit after grace");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(4),
        "{took:?}"
    );

    // A second signal exits at once, long before the grace period.
    let mut w = Webhook::start(&leaf, &["--shutdown-grace=60s", "--body-read-timeout=60s"]);
    w.wait_ready().await;
    let mut stuck = tls_connect(w.webhook, cfg()).await.expect("tls");
    stuck.write_all(stuck_request).await.expect("write");
    stuck.flush().await.expect("flush");
    wait_until(Duration::from_secs(5), || async {
        metric_value(&w.metrics().await, "kube_overcommit_open_connections") >= 1.0
    })
    .await;
    w.signal("TERM");
    assert!(
        wait_until(Duration::from_secs(2), || async {
            w.probe("/readyz").await.0 == 503
        })
        .await
    );
    let t = Instant::now();
    w.signal("TERM");
    let status = wait_exit(&mut w, Duration::from_secs(5))
        .await
        .expect("exit on second signal");
    assert!(!status.success());
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_when_the_watched_process_is_gone() {
    let (_pki, leaf) = leaf_pair();
    let mut parent = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    let mut w = Webhook::start(&leaf, &[&format!("--exit-with-pid={}", parent.id())]);
    w.wait_ready().await;
    parent.kill().expect("kill");
    parent.wait().expect("reap");
    let status = wait_exit(&mut w, Duration::from_secs(5))
        .await
        .expect("exited");
    assert!(status.success(), "{status:?}");
}

async fn wait_exit(w: &mut Webhook, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(st)) = w.child.try_wait() {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_file_reloads_and_a_bad_file_keeps_the_last_good_set() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &["--policy-reload-interval=500ms"]);
    w.wait_ready().await;
    let loaded = |m: &str| metric_value(m, "kube_overcommit_policies_loaded");
    assert_eq!(loaded(&w.metrics().await), 1.0);

    let two = format!(
        "{POLICY_YAML}---\napiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata:\n  name: triple-cpu-gpu-nodes\nspec:\n  priority: 20\n  nodeSelector:\n    matchLabels:\n      gpu: \"true\"\n  nodeRatios:\n    cpu: \"3\"\n"
    );
    std::fs::write(&w.policy_file, &two).expect("write");
    assert!(
        wait_until(Duration::from_secs(5), || async {
            loaded(&w.metrics().await) == 2.0
        })
        .await,
        "two policies not loaded; logs:\n{}",
        w.logs()
    );

    let errors = |m: &str| {
        metric_value(
            m,
            r#"kube_overcommit_policy_reloads_total{source="file",result="error"}"#,
        )
    };
    let bad_files = [
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata:\n  name: too-much\nspec:\n  nodeRatios:\n    cpu: \"50\"\n",
        "{{{ not yaml",
    ];
    for (i, bad) in bad_files.iter().enumerate() {
        std::fs::write(&w.policy_file, bad).expect("write");
        let want = (i + 1) as f64;
        assert!(
            wait_until(Duration::from_secs(5), || async {
                errors(&w.metrics().await) >= want
            })
            .await,
            "bad file {i} not refused; logs:\n{}",
            w.logs()
        );
        assert_eq!(loaded(&w.metrics().await), 2.0, "last good set must stay");
        assert_eq!(w.probe("/readyz").await.0, 200);
    }
    assert!(w.logs().contains("policy file refused"));
    // Reviews still use the last good set.
    let c = client_for(&w, pki.ca_der(), false);
    let v = mutate_json(&c, &w, &node_review("with-last-good", "4")).await;
    assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");

    // Removing every policy restores the truth: no inflation.
    std::fs::write(&w.policy_file, "").expect("write");
    assert!(
        wait_until(Duration::from_secs(5), || async {
            loaded(&w.metrics().await) == 0.0
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(
        &leaf,
        &["--http2", "--idle-timeout=1s", "--header-read-timeout=30s"],
    );
    w.wait_ready().await;
    let open = |m: &str| metric_value(m, "kube_overcommit_open_connections");
    for http2 in [true, false] {
        let c = client_for(&w, pki.ca_der(), http2);
        let r = c
            .post(url(&w, "/mutate"))
            .json(&node_review("idle", "4"))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200);
        assert_eq!(open(&w.metrics().await), 1.0);
        let started = Instant::now();
        let closed = wait_until(Duration::from_secs(5), || async {
            open(&w.metrics().await) == 0.0
        })
        .await;
        assert!(closed, "idle connection (http2={http2}) not closed");
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        // The client reconnects transparently.
        let r = c
            .post(url(&w, "/mutate"))
            .json(&node_review("again", "4"))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200);
        drop(c);
        assert!(
            wait_until(Duration::from_secs(5), || async {
                open(&w.metrics().await) == 0.0
            })
            .await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keepalive_outlives_the_header_timeout() {
    // The API server pools connections for up to 90 s; waiting for the next request is not a
    // slow header, and closing then would race the client's next request.
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &["--header-read-timeout=1s", "--idle-timeout=60s"]);
    w.wait_ready().await;
    let mut s = tls_connect(
        w.webhook,
        client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]),
    )
    .await
    .expect("tls");
    let body = serde_json::to_vec(&node_review("ka", "4")).expect("json");
    let req = [
        format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes(),
        body,
    ]
    .concat();
    for _ in 0..2 {
        s.write_all(&req).await.expect("write");
        assert_eq!(read_response(&mut s).await.expect("response").status, 200);
        assert!(
            !closed_within(&mut s, Duration::from_secs(3)).await,
            "an idle keep-alive connection was closed by the header timeout"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_holds_extra_clients_in_the_backlog() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(
        &leaf,
        &["--max-connections=2", "--tls-handshake-timeout=30s"],
    );
    w.wait_ready().await;
    let cfg = || client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]);
    let first = tls_connect(w.webhook, cfg()).await.expect("first");
    let _second = tls_connect(w.webhook, cfg()).await.expect("second");
    // The third TCP connection is queued by the kernel, not served: its handshake stalls.
    let third = tokio::spawn(tls_connect(w.webhook, cfg()));
    assert!(
        !wait_until(Duration::from_millis(1500), || async {
            third.is_finished()
        })
        .await,
        "a third connection was served above --max-connections=2"
    );
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("served once a slot is free")
        .expect("task");
    assert!(third.is_ok(), "{:?}", third.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_body_over_the_limit_gets_413() {
    let (pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &["--http2", "--max-body-bytes=8388608"]);
    w.wait_ready().await;
    let c = client_for(&w, pki.ca_der(), true);
    let r = c
        .post(url(&w, "/mutate"))
        .header("content-type", "application/json")
        .body(vec![b' '; 8 * 1024 * 1024 + 1])
        .send()
        .await
        .expect("send");
    assert_eq!(r.version(), http::Version::HTTP_2);
    assert_eq!(r.status(), 413);
    // The connection stays usable for the next review.
    let r = c
        .post(url(&w, "/mutate"))
        .json(&node_review("after-413", "4"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
}

#[test]
fn every_serve_flag_has_an_environment_variable() {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    // Each option's block runs from its `--flag` line to the next one.
    let mut blocks: Vec<String> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with("--") || (t.starts_with('-') && t.contains(", --")) {
            blocks.push(String::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    let mut flags = 0;
    for b in &blocks {
        let name = b
            .split_whitespace()
            .find(|w| w.starts_with("--"))
            .unwrap_or("");
        if name == "--help" || name == "--version" {
            continue;
        }
        flags += 1;
        assert!(
            // POD_NAME (the identity) is the one variable Kubernetes names for us.
            b.contains("[env: KUBE_OVERCOMMIT_") || b.contains("[env: POD_NAME="),
            "{name} has no environment variable:\n{b}"
        );
    }
    assert!(flags >= 15, "only {flags} flags found:\n{help}");
    for env in [
        "KUBE_OVERCOMMIT_LISTEN",
        "KUBE_OVERCOMMIT_TLS_DIR",
        "KUBE_OVERCOMMIT_PROBE_LISTEN",
        "KUBE_OVERCOMMIT_POLICY_FILE",
    ] {
        assert!(help.contains(env), "{env}");
    }
}

#[test]
fn bad_flags_are_refused_clearly() {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--max-body-bytes=1000"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max-body-bytes"), "{err}");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--idle-timeout=forever"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_port_connection_limit_holds_extra_clients_in_the_backlog() {
    let (_pki, leaf) = leaf_pair();
    let w = Webhook::start(&leaf, &["--probe-max-connections=2"]);
    w.wait_ready().await;
    // Two idle connections take both slots.
    let first = TcpStream::connect(w.probes).await.expect("first");
    let _second = TcpStream::connect(w.probes).await.expect("second");
    let addr = w.probes;
    let third = tokio::spawn(async move { http_get(addr, "/healthz").await });
    assert!(
        !wait_until(Duration::from_millis(1500), || async {
            third.is_finished()
        })
        .await,
        "a third probe connection was served above --probe-max-connections=2"
    );
    drop(first);
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("served once a slot is free")
        .expect("task");
    assert_eq!(status, 200);
}

// ---------------------------------------------------------------------------------------------
// Hostile clients on the webhook port (issue 19, item 1): 64 parallel 8 MiB uploads and slow
// senders, while legitimate 55 KB node reviews keep being answered correctly and quickly, the
// peak RSS stays under the documented bound, and nothing panics. Without the budget of body
// bytes in flight (run it with `KUBE_OVERCOMMIT_MAX_INFLIGHT_BODY_BYTES=4000000000`) the peak
// RSS goes far above the bound. Heavy (about half a GiB through TLS on loopback), so it is
// `#[ignore]`d in `cargo test` and run by `make test-e2e` (`cargo test --release -- --ignored`):
// `cargo test --release --test serve_tls hostile -- --ignored --nocapture`.

/// The bound documented next to the container's memory limit (deploy/, the chart, README):
/// peak RSS under this attack with the default flags.
const RSS_BOUND_KIB: u64 = 128 * 1024;
const UPLOADS: usize = 64;
const UPLOAD_BYTES: usize = 8 * 1024 * 1024;
/// Slow senders declaring a review-sized body (3 MiB) and slow senders without a length.
const SLOW_DECLARED: usize = 4;
const SLOW_CHUNKED: usize = 8;
/// Longest answer a legitimate review may take (the API server's default timeout is 2 s).
const MAX_LATENCY: Duration = Duration::from_millis(1500);

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// One 8 MiB upload as fast as the server takes it; returns the status (0: connection cut).
async fn upload(w_addr: std::net::SocketAddr, cfg: rustls::ClientConfig) -> u16 {
    let Ok(mut s) = tls_connect(w_addr, cfg).await else {
        return 0;
    };
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {UPLOAD_BYTES}\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let chunk = vec![b' '; 256 * 1024];
    for _ in 0..UPLOAD_BYTES / chunk.len() {
        if s.write_all(&chunk).await.is_err() {
            break;
        }
    }
    match tokio::time::timeout(Duration::from_secs(5), read_response(&mut s)).await {
        Ok(Ok(r)) => r.status,
        _ => 0,
    }
}

/// A sender of a few bytes per second until `stop`.
async fn slow_sender(
    w_addr: std::net::SocketAddr,
    cfg: rustls::ClientConfig,
    declared: bool,
    stop: Arc<AtomicBool>,
) {
    let Ok(mut s) = tls_connect(w_addr, cfg).await else {
        return;
    };
    let head = if declared {
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 3145728\r\n\r\n"
    } else {
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    };
    if s.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        let bytes: &[u8] = if declared { b"  " } else { b"2\r\n  \r\n" };
        if s.write_all(bytes).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "heavy: half a GiB over TLS; run by make test-e2e (cargo test --release -- --ignored)"]
async fn hostile_uploads_and_slow_senders_keep_memory_bounded_and_reviews_answered() {
    let pki = Pki::new();
    let leaf = pki.leaf("hostile");
    // Default limits, as deployed; the slow senders outlast the whole run.
    let w = Webhook::start(&leaf, &["--body-read-timeout=60s"]);
    w.wait_ready().await;
    let pid = w.child.id();
    let base_kib = vm_hwm_kib(pid);
    let cfg = || client_config(pki.ca_der(), &all_versions(), &[b"http/1.1"]);

    let stop = Arc::new(AtomicBool::new(false));
    let mut slow = Vec::new();
    for i in 0..SLOW_DECLARED + SLOW_CHUNKED {
        slow.push(tokio::spawn(slow_sender(
            w.webhook,
            cfg(),
            i < SLOW_DECLARED,
            stop.clone(),
        )));
    }

    // Legitimate reviews, one after another on a keep-alive connection, throughout.
    let payload = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/payloads/node-55k.json"
    ))
    .expect("bench/payloads/node-55k.json");
    let uid = serde_json::from_str::<serde_json::Value>(&payload).expect("payload json")["request"]
        ["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let client = client_for(&w, pki.ca_der(), false);
    let answered = Arc::new(AtomicUsize::new(0));
    let legit = {
        let (stop, answered, w_url) = (stop.clone(), answered.clone(), url(&w, "/mutate"));
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let mut failures = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let my_uid = format!("legit-{i}");
                let body = payload.replacen(&uid, &my_uid, 1);
                let started = Instant::now();
                let r = client
                    .post(&w_url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let v: Option<serde_json::Value> = match r {
                    Ok(r) if r.status() == 200 => r.json().await.ok(),
                    Ok(r) => {
                        failures.push(format!("review {i}: status {}", r.status()));
                        None
                    }
                    Err(e) => {
                        failures.push(format!("review {i}: {e}"));
                        None
                    }
                };
                worst = worst.max(started.elapsed());
                if let Some(v) = v {
                    if v["response"]["uid"] == my_uid.as_str()
                        && v["response"]["allowed"] == true
                        && v["response"]["patchType"] == "JSONPatch"
                    {
                        answered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failures.push(format!("review {i}: wrong answer {}", v["response"]));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (worst, failures)
        })
    };

    // The uploads, all at once.
    let started = Instant::now();
    let uploads: Vec<_> = (0..UPLOADS)
        .map(|_| tokio::spawn(upload(w.webhook, cfg())))
        .collect();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for u in uploads {
        *statuses.entry(u.await.expect("upload task")).or_default() += 1;
    }
    let upload_time = started.elapsed();
    // Reviews keep being answered after the flood too, with the slow senders still there.
    let before = answered.load(Ordering::Relaxed);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            answered.load(Ordering::Relaxed) >= before + 5
        })
        .await,
        "reviews stopped being answered after the uploads"
    );
    stop.store(true, Ordering::Relaxed);
    let (worst, failures) = legit.await.expect("legit task");
    for s in slow {
        let _ = s.await;
    }

    let peak_kib = vm_hwm_kib(pid);
    let logs = w.logs();
    let n = answered.load(Ordering::Relaxed);
    eprintln!(
        "hostile clients: peak RSS (VmHWM) {} MiB (idle {} MiB, bound {} MiB); {UPLOADS} x 8 MiB uploads in {:.1}s, statuses {statuses:?}; {n} legitimate 55 KB reviews answered, worst latency {} ms",
        peak_kib / 1024,
        base_kib / 1024,
        RSS_BOUND_KIB / 1024,
        upload_time.as_secs_f64(),
        worst.as_millis()
    );
    assert!(!logs.contains("panicked"), "the process panicked:\n{logs}");
    assert!(
        peak_kib <= RSS_BOUND_KIB,
        "peak RSS {} MiB above the documented {} MiB",
        peak_kib / 1024,
        RSS_BOUND_KIB / 1024
    );

    assert!(
        w.probe("/healthz").await.0 == 200,
        "the process no longer answers"
    );
    assert!(
        failures.is_empty(),
        "legitimate reviews failed: {failures:?}"
    );
    assert!(n >= 20, "only {n} legitimate reviews answered");
    assert!(worst <= MAX_LATENCY, "a legitimate review took {worst:?}");
    assert!(
        statuses.get(&503).copied().unwrap_or(0) > 0,
        "no upload was turned away by the budget: {statuses:?}"
    );
}
