-- Turn this owner's write hold into a read hold without letting go.
-- ARGV[2]  lease, ms
-- returns  1 if downgraded, 0 if this owner no longer held the write lock
-- helpers --
local lease = tonumber(ARGV[2])
local now_ms = millis(redis.call('TIME'))
local holder, _, last = read_gate(now_ms)
if not owns(holder) then
  return 0
end
local _, readers, _, settle, wake, live_head = crowd()
redis.call('ZADD', readers, now_ms + lease, me)
-- The record goes with the hold: the same token, granted when the write was.
local since = string.sub(holder, 33, 43)
redis.call('HSET', info, me, string.format('%x %s %s', last, since ~= '' and since or string.format('%x', now_ms),
  string.sub(holder, 44)))
if redis.call('PTTL', readers) < lease then
  redis.call('PEXPIRE', readers, lease)
end
-- Wake only the waiter now first in line (its id after `w:` / `r:`), not the herd.
local head, engine = live_head(nil)
if head then
  wake(engine, string.sub(head, 3))
end
settle(nil, nil, last, now_ms)
return 1
