-- holder(record): the caller a slot's (or a ticket's) record names, ''
-- when none. The caller is the first field after the TTL and start (see
-- pkg/lua/records.go), so only that place is read: fields after it (a
-- user id, a label) may hold any character, ';caller=' too.
local function holder(record)
  if not record then
    return ''
  end
  return string.match(record, '^%d*;started=%d+;caller=([^;]*)')
    or string.match(record, '^%d*;caller=([^;]*)') or ''
end

-- foreign(record, caller): whether the record names a caller other than
-- caller. A call with no caller (an open API) and a record with none (a
-- slot taken while the API was open) are nobody's: never foreign.
local function foreign(record, caller)
  if caller == '' then
    return false
  end
  local h = holder(record)
  return h ~= '' and h ~= caller
end

-- ownTTL(record, ttl): the TTL a slot's record starts with (ms), which
-- its heartbeats keep it by whatever its plan says now; ttl when the
-- record has none (an older version's, or no record).
local function ownTTL(record, ttl)
  local own = record and tonumber((string.match(record, '^%d+'))) -- (): one value (the embedded store's match may return none)
  if own and own > 0 then
    return own
  end
  return ttl
end

-- The head of a record that has a start: its TTL, its start and its
-- caller (if it names one), which an extension count follows (see
-- again); nil for a record without a start (an older version's).
local function recordHead(record)
  return string.match(record, '^%d*;started=%d+;caller=[^;]*')
    or string.match(record, '^%d*;started=%d+')
end

-- sharesOf(record): a record with a start, taken apart where it keeps its
-- shares: its head; n, how many acquires of the stream extended its slot
-- (or membership) after the one that took it (';again=<n>' right after
-- the head, 0 when none: the n-th holds share n, see leave); the shares
-- given up (';left=<i>.<j>', '' when none); the requests that took the
-- shares held, as '<n>@<token>' each, the latest first, joined by '.'
-- (';by=', '' when none: see ownedShare; a '!' after share 0's says that
-- shadow mode let a new slot in over its limit, for its call asked again
-- to say so too); and the rest. Nil for a record without a start (an
-- older version's), which counts no extensions. Read at that place only,
-- as holder reads the caller: a label or a user id may hold ';again='
-- too. The previous versions knew again and left, and the one before
-- this one by's first entry alone, and kept what follows as it was: so
-- by comes last, and its first entry is the latest share's, which an
-- extension by that version replaces (while both run, that request,
-- asked again, counts one more share, as it did before the list).
local function sharesOf(record)
  local head = recordHead(record)
  if not head then
    return nil
  end
  local rest = string.sub(record, #head + 1)
  local n, after = string.match(rest, '^;again=(%d+)(.*)$')
  if not n then
    n, after = '0', rest
  end
  local list, tail = string.match(after, '^;left=([%d%.]*)(.*)$')
  if list then
    after = tail
  else
    list = ''
  end
  local by
  by, tail = string.match(after, '^;by=([%w_%-@!%.]*)(.*)$')
  if by then
    after = tail
  else
    by = ''
  end
  return head, tonumber(n), list, by, after
end

-- withShares(head, n, list, by, rest): the record sharesOf took apart.
local function withShares(head, n, list, by, rest)
  local s = head
  if n > 0 then
    s = s .. ';again=' .. string.format('%d', n)
    if list ~= '' then
      s = s .. ';left=' .. list
    end
  end
  if by ~= '' then
    s = s .. ';by=' .. by
  end
  return s .. rest
end

-- isLeft(list, share): whether share is in list, the shares given up.
local function isLeft(list, share)
  for s in string.gmatch(list, '%d+') do
    if tonumber(s) == share then
      return true
    end
  end
  return false
end

-- again(record): the record's count of extensions (see sharesOf), 0 when
-- none.
local function again(record)
  if not record then
    return 0
  end
  local _, n = sharesOf(record)
  return n or 0
end

-- tokenOf(record): the token of the request that took the record's
-- latest share (see sharesOf), '' when none: what a new slot's record,
-- as a request writes it (';by=0@<token>'), names.
local function tokenOf(record)
  local _, _, _, by = sharesOf(record)
  return string.match(by or '', '^%d+@([%w_%-]*)') or ''
end

-- ownedShare(record, token): the share the request of token (not '')
-- took and holds (not left), nil when none: its call, asked again after
-- the reply was lost, which changes nothing and is answered that share,
-- whichever requests extended the slot meanwhile.
local function ownedShare(record, token)
  local head, n, list, by = sharesOf(record)
  if token == '' or not head then
    return nil
  end
  for share, tok in string.gmatch(by, '(%d+)@([%w_%-]+)') do
    local k = tonumber(share)
    if tok == token and k <= n and not isLeft(list, k) then
      return k
    end
  end
  return nil
end

-- overLimit(record): the record of a new slot, marked as let in over its
-- limit by shadow mode (see sharesOf), when it names its request; as it
-- is when it does not.
local function overLimit(record)
  local head, n, list, by, rest = sharesOf(record)
  if not head or by == '' then
    return record
  end
  return withShares(head, n, list, by .. '!', rest)
end

-- wasOverLimit(record): whether the record says shadow mode let its
-- slot in over its limit (see overLimit): share 0's request is marked.
local function wasOverLimit(record)
  local _, _, _, by = sharesOf(record)
  for share, mark in string.gmatch(by or '', '(%d+)@[%w_%-]+(!?)') do
    if share == '0' then
      return mark == '!'
    end
  end
  return false
end

-- heldRequests is how many requests' shares a record names at most (see
-- extended; share 0's, marked over the limit, besides): a request asked again after as many others extended the
-- slot in between counts one more share, which holds the slot until it
-- expires.
local heldRequests = 8

-- extended(record, token): the record of a slot one more acquire
-- extended, by the request of token ('' for none), which is named first
-- (see ownedShare), before those of the shares still held, at most
-- heldRequests. Share 0's entry, when marked over the limit (see
-- overLimit), stays last, held or not: the verdict on the acquire that
-- took the slot, which its extensions answer. A record without a start
-- is not counted (again reads 0 of it).
local function extended(record, token)
  local head, n, list, by, rest = sharesOf(record)
  if not head then
    return record
  end
  local named = {}
  if token ~= '' then
    named[1] = string.format('%d', n + 1) .. '@' .. token
  end
  for entry, share, mark in string.gmatch(by, '((%d+)@[%w_%-]+(!?))') do
    if share == '0' and mark == '!' then
      named[#named + 1] = entry
    elseif #named < heldRequests and not isLeft(list, tonumber(share)) then
      named[#named + 1] = entry
    end
  end
  return withShares(head, n + 1, list, table.concat(named, '.'), rest)
end

-- startedAt(record): the record's start (Redis ms, as written), '' when
-- it has none.
local function startedAt(record)
  return string.match(record, '^%d*;started=(%d+)') or ''
end

-- leave(record, share, start): the request that holds share of a
-- stream's slot (0: the acquire that took it; n: the n-th that extended
-- it, see again) gives it up. The requests that gave theirs up are
-- listed in ';left=' after the count, so that a leave asked again
-- changes nothing more. Answers true when every share has gone (the slot
-- goes), the record to keep while another request holds one, and false
-- when the record is not known to be of the slot the share is of: it
-- counts fewer extensions, or it started at another time than start (a
-- later slot of the stream, taken after that one was released), or start
-- is '' (a share whose grant's answer was lost: it may be another
-- request's). A record without a start (an older version's) counts no
-- extensions: share 0 of it leaves it.
local function leave(record, share, start)
  local head, n, list, by, rest = sharesOf(record)
  if not head then
    return share == 0
  end
  if startedAt(record) ~= start then
    return false
  end
  if share > n then
    return false
  end
  local gone, count = {}, 0
  for s in string.gmatch(list, '%d+') do
    if not gone[s] then
      gone[s], count = true, count + 1
    end
  end
  local mine = string.format('%d', share)
  if not gone[mine] then
    if #list > 200 then
      return record -- a list that long is not grown: the slot expires
    end
    count = count + 1
    if list == '' then
      list = mine
    else
      list = list .. '.' .. mine
    end
  end
  if count > n then
    return true
  end
  return withShares(head, n, list, by, rest)
end

-- heldAfter(record, share): whether a share of the slot later than share
-- is held (not given up): a request that extended it after share's did,
-- by any version, and may have been answered the expiry share's set.
local function heldAfter(record, share)
  local head, n, list = sharesOf(record)
  if not head then
    return false
  end
  local gone, left = {}, 0
  for s in string.gmatch(list, '%d+') do
    if tonumber(s) > share and not gone[s] then
      gone[s], left = true, left + 1
    end
  end
  return left < n - share
end
