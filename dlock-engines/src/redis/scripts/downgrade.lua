-- Turn this owner's write hold into a read hold without letting go.
-- KEYS[1]  the lock's prefix
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  the publish command: "PUBLISH" (one server) or "SPUBLISH" (cluster)
-- returns  1 if downgraded, 0 if this owner no longer held the write lock
local p = KEYS[1]
local writer, readers = p .. ':w', p .. ':r'
local me, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('GET', writer) ~= me then
  return 0
end
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
redis.call('DEL', writer)
redis.call('ZADD', readers, now_ms + lease, me)
if redis.call('PTTL', readers) < lease then
  redis.call('PEXPIRE', readers, lease)
end
-- Wake only the waiter now first in line (its id after `w:` / `r:`), not the herd.
local head = redis.call('LINDEX', p .. ':q', 0)
if head then
  redis.call(ARGV[3], p .. ':n', string.sub(head, 3))
end
return 1
