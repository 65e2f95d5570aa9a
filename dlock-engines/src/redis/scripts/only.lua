-- The holds an operator's act is for (control.lua; semaphore.lua's force
-- and revoke): a test `admitted(owner, fence)` of the holds named in
-- ARGV[from..], each `<owner id> <fence in hex>`, acted on only while the
-- owner holds with that fence; with none named, every hold.
local function holds_named(from)
  if #ARGV < from then
    return function()
      return true
    end
  end
  local only = {}
  for i = from, #ARGV do
    local owner, fence = string.match(ARGV[i], '^(%S+) (%x+)$')
    only[owner] = tonumber(fence, 16)
  end
  return function(owner, fence)
    return fence ~= nil and only[owner] == fence
  end
end
