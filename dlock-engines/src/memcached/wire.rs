//! The few meta-protocol commands the engine needs, over a small pool of
//! connections. A connection that fails is dropped and made again on next
//! use. Requests on one connection run in order, so a pipelined pair of
//! commands is applied by the server one after the other. A new
//! connection speaks TLS and logs in first, where the settings say so,
//! all within the connect timeout.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;

/// A connection's bytes: plain TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

type Connection = BufReader<Box<dyn Stream>>;

/// What a new connection does before its first command.
#[derive(Default)]
pub(crate) struct Opening {
    /// TLS, checking the server's certificate for this name.
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
    /// The login `-Y` asks for: a `set` whose data is `<user> <password>`.
    pub login: Option<Vec<u8>>,
}

/// One answer: the status line, read as its code and tokens, and the
/// value if any. The line is kept whole and split when asked: a reply is
/// one allocation (two with a value), not one per token.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The status line without its line end.
    line: String,
    pub value: Option<Vec<u8>>,
}

impl Reply {
    /// `HD`, `NF`, `VA`, ...
    pub fn code(&self) -> &str {
        self.line.split_once(' ').map_or(&self.line, |(code, _)| code)
    }

    /// The tokens after the code (and after a value's size).
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        let skip = if self.value.is_some() { 2 } else { 1 };
        self.line.split(' ').skip(skip)
    }

    /// A flag's token, e.g. `c` in `HD c42` gives `"42"`.
    pub fn flag(&self, name: char) -> Option<&str> {
        self.tokens().find_map(|f| f.strip_prefix(name))
    }
}

pub(crate) struct Pool {
    address: String,
    timeout: Duration,
    opening: Opening,
    connections: Vec<Mutex<Option<Connection>>>,
    next: AtomicUsize,
}

impl Pool {
    pub fn new(address: String, size: usize, timeout: Duration, opening: Opening) -> Self {
        Pool {
            address,
            timeout,
            opening,
            connections: (0..size.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Sends `request` (one or more commands) and reads `replies` answers.
    pub async fn call(&self, request: &[u8], replies: usize) -> io::Result<Vec<Reply>> {
        self.call_until(request, |read| read.len() == replies).await
    }

    /// Sends `request` and reads answers (one a line, for `stats`) until
    /// `done` says the ones read are all.
    pub async fn call_until(
        &self,
        request: &[u8],
        done: impl Fn(&[Reply]) -> bool,
    ) -> io::Result<Vec<Reply>> {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        let mut slot = self.connections[at].lock().await;
        // Taken out for the exchange and put back only once it is whole: a
        // call that fails or is dropped halfway (the core bounds every call)
        // would leave the stream out of step.
        let mut connection = match slot.take() {
            Some(connection) => connection,
            None => self.connect().await?,
        };
        let answered = exchange(&mut connection, request, done).await?;
        *slot = Some(connection);
        Ok(answered)
    }

    /// A new connection, ready for commands.
    async fn connect(&self) -> io::Result<Connection> {
        let no_answer = |_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.timeout),
            )
        };
        tokio::time::timeout(self.timeout, self.open())
            .await
            .map_err(no_answer)?
    }

    async fn open(&self) -> io::Result<Connection> {
        let tcp = TcpStream::connect(&self.address).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match &self.opening.tls {
            Some((connector, name)) => Box::new(connector.connect(name.clone(), tcp).await?),
            None => Box::new(tcp),
        };
        let mut connection = BufReader::new(stream);
        if let Some(login) = &self.opening.login {
            // Only a server that asks for a login gets one: to any other,
            // the login's `set` would store the password as an item.
            match exchange(&mut connection, b"mn\r\n", |read| read.len() == 1).await {
                Err(e) if e.to_string().ends_with("CLIENT_ERROR unauthenticated") => {}
                Ok(_) => {
                    return Err(io::Error::other(
                        "memcached asks for no login (it runs without -Y): the password was not sent; \
                         drop username and password, or run it with -Y",
                    ));
                }
                Err(e) => return Err(e),
            }
            let replies = exchange(&mut connection, login, |read| read.len() == 1).await?;
            if replies[0].code() != "STORED" {
                return Err(io::Error::other(format!(
                    "memcached refused the login: {}",
                    replies[0].code()
                )));
            }
        }
        Ok(connection)
    }
}

async fn exchange(
    connection: &mut Connection,
    request: &[u8],
    done: impl Fn(&[Reply]) -> bool,
) -> io::Result<Vec<Reply>> {
    let stream = connection.get_mut();
    stream.write_all(request).await?;
    // TLS keeps what is written until flushed.
    stream.flush().await?;
    let mut out = Vec::with_capacity(2);
    while !done(&out) {
        out.push(read_reply(connection).await?);
    }
    Ok(out)
}

async fn read_reply(connection: &mut Connection) -> io::Result<Reply> {
    let mut line = String::new();
    if connection.read_line(&mut line).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "memcached closed the connection",
        ));
    }
    line.truncate(line.trim_end().len());
    let mut words = line.split(' ');
    let code = words.next().unwrap_or_default();
    if code.ends_with("ERROR") {
        return Err(io::Error::other(format!("memcached: {line}")));
    }
    let value = if code == "VA" {
        let size: usize = words
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("memcached: bad reply {line:?}")))?;
        let mut value = vec![0; size + 2];
        connection.read_exact(&mut value).await?;
        value.truncate(size);
        Some(value)
    } else {
        None
    };
    Ok(Reply { line, value })
}
