//! The tests' HTTPS client: hyper's client connections over tokio-rustls, trusting the test CA,
//! HTTP/1.1 keep-alive or HTTP/2 with prior knowledge, one request at a time per client, a new
//! connection when the last one closed. Built from crates the binary already uses: a client
//! crate such as reqwest turns on features of shared crates, and `make test` then builds the
//! release graph twice (src/temp_dir.rs says more).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::Mutex;

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// A client of one server address (`localhost` in the URL is the name the certificate is
/// checked against); clones share the connection.
#[derive(Clone)]
pub(crate) struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    http2: bool,
    timeout: Duration,
    conn: Mutex<Option<Sender>>,
}

enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

impl Client {
    /// `timeout` bounds each request: connecting, sending and reading the whole answer.
    pub(crate) fn new(
        addr: SocketAddr,
        tls: rustls::ClientConfig,
        http2: bool,
        timeout: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                addr,
                tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
                http2,
                timeout,
                conn: Mutex::new(None),
            }),
        }
    }

    pub(crate) fn post(&self, url: impl AsRef<str>) -> RequestBuilder {
        self.request(Method::POST, url.as_ref())
    }

    pub(crate) fn get(&self, url: impl AsRef<str>) -> RequestBuilder {
        self.request(Method::GET, url.as_ref())
    }

    fn request(&self, method: Method, url: &str) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            method,
            url: url.to_owned(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            timeout: self.inner.timeout,
            error: None,
        }
    }

    async fn connect(&self, host: &str) -> Result<Sender, Error> {
        let tcp = TcpStream::connect(self.inner.addr).await?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(host.to_owned())?;
        let io = TokioIo::new(self.inner.tls.connect(name, tcp).await?);
        if self.inner.http2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Ok(Sender::Http2(sender))
        } else {
            let (sender, conn) = http1::handshake(io).await?;
            tokio::spawn(conn);
            Ok(Sender::Http1(sender))
        }
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Response, Error> {
        let host = request.uri().host().unwrap_or("localhost").to_owned();
        let mut conn = self.inner.conn.lock().await;
        // A connection the server closed since the last request is replaced.
        let live = match conn.as_mut() {
            Some(Sender::Http1(s)) => s.ready().await.is_ok(),
            Some(Sender::Http2(s)) => s.ready().await.is_ok(),
            None => false,
        };
        if !live {
            *conn = Some(self.connect(&host).await?);
        }
        let answer = match conn.as_mut() {
            Some(Sender::Http1(s)) => s.send_request(request).await?,
            Some(Sender::Http2(s)) => s.send_request(request).await?,
            None => return Err("no connection".into()),
        };
        let (parts, body) = answer.into_parts();
        Ok(Response {
            status: parts.status,
            version: parts.version,
            headers: parts.headers,
            body: body.collect().await?.to_bytes(),
        })
    }
}

pub(crate) struct RequestBuilder {
    client: Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Bytes,
    timeout: Duration,
    error: Option<Error>,
}

impl RequestBuilder {
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        match (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            (Ok(name), Ok(value)) => {
                self.headers.insert(name, value);
            }
            _ => self.error = Some(format!("bad header {name}: {value}").into()),
        }
        self
    }

    pub(crate) fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// The value as JSON, with `content-type: application/json`.
    pub(crate) fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.body = body.into();
                self.headers
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            Err(e) => self.error = Some(e.into()),
        }
        self
    }

    pub(crate) fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub(crate) async fn send(self) -> Result<Response, Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let uri: Uri = self.url.parse()?;
        let authority = uri.authority().ok_or("URL without a host")?.to_string();
        // HTTP/1.1 sends the path and a Host header; HTTP/2 the whole URL (:scheme, :authority).
        let (uri, version) = if self.client.inner.http2 {
            (uri, Version::HTTP_2)
        } else {
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            (path.parse()?, Version::HTTP_11)
        };
        let mut request = Request::builder()
            .method(self.method)
            .uri(uri)
            .version(version)
            .body(Full::new(self.body))?;
        *request.headers_mut() = self.headers;
        if version == Version::HTTP_11 {
            request
                .headers_mut()
                .insert(HOST, HeaderValue::try_from(authority)?);
        }
        tokio::time::timeout(self.timeout, self.client.send(request))
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}

/// A whole answer.
#[derive(Debug)]
pub(crate) struct Response {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
}

impl Response {
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn version(&self) -> Version {
        self.version
    }

    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    pub(crate) async fn json<T: serde::de::DeserializeOwned>(self) -> Result<T, Error> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    pub(crate) async fn text(self) -> Result<String, Error> {
        Ok(String::from_utf8(self.body.to_vec())?)
    }

    pub(crate) async fn bytes(self) -> Result<Bytes, Error> {
        Ok(self.body)
    }
}
