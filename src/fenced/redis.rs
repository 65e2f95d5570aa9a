//! Fenced `SET` and `HSET` on Redis (feature `fenced-redis`), each one Lua
//! script, so no other client's command runs between the check and the
//! write.
//!
//! Each keeps the highest token it has accepted for the key, refuses a
//! token below it ([`FenceError::Stale`], with the highest), and otherwise
//! writes and keeps the token:
//!
//! - [`set`] keeps it in a companion key, [`fence_key`] (`<key>:dlock:fence`).
//!   The script touches both keys, so on a Redis Cluster they must hash to
//!   one slot: give the key a hash tag, `{order:42}`, and its companion
//!   `{order:42}:dlock:fence` has it too.
//! - [`hset`] keeps it in a field of the hash itself, [`FENCE_FIELD`].
//!
//! Tokens are compared as decimal text (by length, then by bytes), since
//! Lua's numbers are doubles, exact only up to 2^53.
//!
//! For a permit, key by the slot ([`Token::slot`]) as well: each slot's
//! keys are fenced by that slot's tokens alone.

use once_cell::sync::Lazy;
use redis::aio::ConnectionLike;
use redis::{RedisError, Script, ToRedisArgs};

use super::{FenceError, Token};

/// The field of a hash written by [`hset`] that keeps its highest token.
pub const FENCE_FIELD: &str = "dlock:fence";

/// The key in which [`set`] keeps `key`'s highest token.
pub fn fence_key(key: &str) -> String {
    format!("{key}:dlock:fence")
}

/// `below(a, b)`: token `a` is below token `b`, both decimal text without
/// leading zeros.
const BELOW: &str = r"
local function below(a, b)
    if #a ~= #b then return #a < #b end
    return a < b
end
";

/// KEYS: the key, its companion. ARGV: the token, the value.
static SET: Lazy<Script> = Lazy::new(|| {
    Script::new(&format!(
        r"{BELOW}
local seen = redis.call('GET', KEYS[2]) or '0'
if below(ARGV[1], seen) then return {{0, seen}} end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {{1, ARGV[1]}}"
    ))
});

/// KEYS: the hash. ARGV: the fence field, the token, then field, value, ...
static HSET: Lazy<Script> = Lazy::new(|| {
    Script::new(&format!(
        r"{BELOW}
local seen = redis.call('HGET', KEYS[1], ARGV[1]) or '0'
if below(ARGV[2], seen) then return {{0, seen}} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 3))
return {{1, ARGV[2]}}"
    ))
});

/// `SET key value`, only if no token above `token` has written `key`.
///
/// ```no_run
/// # async fn save(con: &mut redis::aio::MultiplexedConnection, guard: &dlock::Guard) -> Result<(), Box<dyn std::error::Error>> {
/// use dlock::fenced::{Token, redis};
///
/// redis::set(con, "{order:42}", "paid", Token::of(guard)).await?;
/// # Ok(())
/// # }
/// ```
pub async fn set(
    con: &mut impl ConnectionLike,
    key: &str,
    value: impl ToRedisArgs,
    token: Token,
) -> Result<(), FenceError<RedisError>> {
    let mut call = SET.key(key);
    call.key(fence_key(key)).arg(token.fence).arg(value);
    answer(token, call.invoke_async(con).await)
}

/// `HSET key field value ...`, only if no token above `token` has written
/// `key`; the hash's [`FENCE_FIELD`] keeps the highest token.
///
/// ```no_run
/// # async fn save(con: &mut redis::aio::MultiplexedConnection, guard: &dlock::Guard) -> Result<(), Box<dyn std::error::Error>> {
/// use dlock::fenced::{Token, redis};
///
/// redis::hset(con, "order:42", &[("state", "paid"), ("by", "billing")], Token::of(guard)).await?;
/// # Ok(())
/// # }
/// ```
pub async fn hset(
    con: &mut impl ConnectionLike,
    key: &str,
    fields: &[(impl ToRedisArgs, impl ToRedisArgs)],
    token: Token,
) -> Result<(), FenceError<RedisError>> {
    let mut call = HSET.key(key);
    call.arg(FENCE_FIELD).arg(token.fence).arg(fields);
    answer(token, call.invoke_async(con).await)
}

/// What a script's `{accepted, highest}` means.
fn answer(token: Token, reply: Result<(bool, u64), RedisError>) -> Result<(), FenceError<RedisError>> {
    match reply.map_err(FenceError::Storage)? {
        (true, _) => Ok(()),
        (false, seen) => Err(FenceError::Stale {
            token: token.fence,
            seen,
        }),
    }
}
