//! Setting defaults shared by several engines' configs (serde `default = ...`).

/// How long connecting to a server may take before startup fails.
#[cfg(any(
    feature = "etcd",
    feature = "memcached",
    feature = "mysql",
    feature = "postgres",
    feature = "redis",
    feature = "redlock",
    feature = "zookeeper"
))]
pub(crate) fn connect_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}

/// Parent of every lock's path on servers that keep a tree of names.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn root() -> String {
    "/locks".to_owned()
}
