//! The benchmark floor: the product's TLS and HTTP stack (rustls with the ring provider,
//! hyper 1 over tokio, HTTP/1.1 keep-alive) with no admission logic at all. It reads the
//! whole request body and answers a fixed AdmissionReview, so kube-overcommit's distance
//! from it is the cost of its own work.
//!
//! Usage: tls-floor --listen 127.0.0.1:PORT --tls-dir DIR [--max-seconds N]
#![forbid(unsafe_code)]

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Same limit as the product accepts (issue 3: at least 8 MiB).
const MAX_BODY: usize = 8 << 20;

/// Shaped like a real answer so the client parses the same amount of response.
const FIXED_RESPONSE: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-0000-0000-000000000000","allowed":true}}"#;

struct Args {
    listen: SocketAddr,
    tls_dir: PathBuf,
    max_seconds: u64,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut listen = None;
    let mut tls_dir = None;
    let mut max_seconds = 3600;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = Some(value.parse().context("--listen")?),
            "--tls-dir" => tls_dir = Some(PathBuf::from(value)),
            "--max-seconds" => max_seconds = value.parse().context("--max-seconds")?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(Args {
        listen: listen.context("--listen is required")?,
        tls_dir: tls_dir.context("--tls-dir is required")?,
        max_seconds,
    })
}

fn tls_config(dir: &std::path::Path) -> anyhow::Result<ServerConfig> {
    let certs = CertificateDer::pem_file_iter(dir.join("tls.crt"))
        .context("reading tls.crt")?
        .collect::<Result<Vec<_>, _>>()
        .context("parsing tls.crt")?;
    let key = PrivateKeyDer::from_pem_file(dir.join("tls.key")).context("reading tls.key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let status = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => {
            // Touch the bytes so the read cannot be optimised away.
            std::hint::black_box(body.to_bytes());
            StatusCode::OK
        }
        Err(_) => StatusCode::PAYLOAD_TOO_LARGE,
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(FIXED_RESPONSE)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(&args.tls_dir)?));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    eprintln!("tls-floor listening on {}", args.listen);
    let serve = async move {
        loop {
            let Ok((tcp, _peer)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service_fn(answer))
                    .await;
            });
        }
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    // Stops by itself: on SIGTERM/SIGINT or after --max-seconds.
    tokio::select! {
        () = serve => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
        () = tokio::time::sleep(Duration::from_secs(args.max_seconds)) => {}
    }
    Ok(())
}
