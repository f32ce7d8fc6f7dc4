-- Checks every response body against the file (args[1]); `done` prints
-- the totals of all threads.
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  local f = assert(io.open(args[1], "rb"))
  expected = f:read("*a")
  f:close()
  ok = 0
  bad = 0
end
function response(status, headers, body)
  if status == 200 and body == expected then ok = ok + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local tok, tbad = 0, 0
  for _, t in ipairs(threads) do
    tok = tok + t:get("ok")
    tbad = tbad + t:get("bad")
  end
  io.write(string.format("checked ok %d bad %d\n", tok, tbad))
end
