-- An operator acts on a lock's holders: forces them out ("force"), or asks
-- them to let go ("revoke"). Each holder is noted in the hash `:o`, as
-- `f:<owner>` or `r:<owner>`, for as long as its lease runs: what its
-- renewal (renew.lua) or its question after a failed one (forced.lua)
-- reads. Forcing out passes the lock on as a release does; the last token
-- stays, so the next holder's is greater. Either is published on the
-- lock's channel `:c`, which holders past their first renewal hear.
-- ARGV[1]  empty: the caller holds nothing
-- ARGV[2]  "force" or "revoke"
-- ARGV[3..] the holds to act on, each `<owner id> <fence in hex>`, acted on
--          only while the owner holds with that fence; none: every hold
-- returns  how many holders were forced out or asked
-- helpers --
local time = redis.call('TIME')
local now_ms = millis(time)
local holder, deadline, last, crowded = read_gate(now_ms)
local queue, readers, pending, settle, _, _, _, pass_on = crowd()

local admitted = holds_named(3)

local writer = holder and admitted(string.sub(holder, 1, 32), last)
local live = {}
if crowded then
  local all = redis.call('ZRANGEBYSCORE', readers, '(' .. now_ms, '+inf', 'WITHSCORES')
  for i = 1, #all, 2 do
    local fence = string.match(redis.call('HGET', info, all[i]) or '', '^(%x+) ')
    if admitted(all[i], fence and tonumber(fence, 16)) then
      live[#live + 1], live[#live + 2] = all[i], all[i + 1]
    end
  end
end
if not writer and #live == 0 then
  return 0
end

local noted, mark, longest = p .. ':o', ARGV[2] == 'force' and 'f:' or 'r:', 0
if writer then
  redis.call('HSET', noted, mark .. string.sub(holder, 1, 32), 1)
  longest = deadline - now_ms
end
for i = 1, #live, 2 do
  redis.call('HSET', noted, mark .. live[i], 1)
  longest = math.max(longest, tonumber(live[i + 1]) - now_ms)
end
if redis.call('PTTL', noted) < longest then
  redis.call('PEXPIRE', noted, longest)
end
local count = (writer and 1 or 0) + #live / 2
redis.call(publish, p .. ':c', ARGV[2])
if ARGV[2] == 'revoke' then
  return count
end

if not crowded then
  put(nil, nil, last, now_ms, 0)
  return count
end
for i = 1, #live, 2 do
  redis.call('ZREM', readers, live[i])
  redis.call('HDEL', info, live[i])
end
if writer then
  holder = nil
end
holder, deadline, last = pass_on(holder, deadline, last, time, now_ms)
settle(holder, deadline, last, now_ms)
return count
