package lua

import (
	"strings"
	"testing"
	"time"
)

func TestRecordsReadBackAsWritten(t *testing.T) {
	cases := []struct {
		name   string
		record string // as stored
		want   StoredRecord
	}{
		{"a TTL alone, as the first versions wrote", "120000", StoredRecord{TTL: 2 * time.Minute}},
		{"a caller, as the trust version wrote", "10000;caller=chat-api", StoredRecord{TTL: 10 * time.Second, Record: Record{Caller: "chat-api"}}},
		{"every field", "3000;started=1712345678901;caller=chat-api;plan=paid;label=pod-7",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 1712345678901, Record: Record{Caller: "chat-api", Plan: "paid", Label: "pod-7"}}},
		{"a label holding the separators runs to the end", "3000;started=5;label=a;caller=b=c;label=d",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Record: Record{Label: "a;caller=b=c;label=d"}}},
		{"a field a later version adds is skipped", "3000;started=5;queue=2;plan=free", StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Record: Record{Plan: "free"}}},
		{"a membership's user id holding the separators goes by its length", "3000;started=5;caller=c;user=22:a;label=x;caller=d u=1;label=l",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Record: Record{Caller: "c", User: "a;label=x;caller=d u=1", Label: "l"}}},
		{"a user's slot's pools", "3000;started=5;plan=paid;pools=model=gpt-4o,org=acme",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Record: Record{Plan: "paid", Pools: "model=gpt-4o,org=acme"}}},
		{"a user id cut short reads no further", "3000;started=5;user=9:abc", StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5}},
		{"extensions, the shares left and the latest share's request (the scripts' alone)", "3000;started=5;caller=c;again=2;left=0;by=2@tok-9_Z;plan=paid",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Again: 2, Record: Record{Caller: "c", Plan: "paid"}}},
		{"the requests of the shares held, share 0's marked over the limit", "3000;started=5;again=2;by=2@tokB.1@tokA.0@tok0!;plan=paid",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Again: 2, OverLimit: true, Record: Record{Plan: "paid"}}},
		{"a mark on another share than 0's says nothing", "3000;started=5;again=2;by=2@tokB!.1@tokA.0@tok0;plan=paid",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Again: 2, Record: Record{Plan: "paid"}}},
		{"extensions without a token, as the shares version wrote", "3000;started=5;again=3;left=1.2;plan=paid",
			StoredRecord{TTL: 3 * time.Second, StartedAtMs: 5, Again: 3, Record: Record{Plan: "paid"}}},
		{"no record", "", StoredRecord{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ParseRecord(tc.record); got != tc.want {
				t.Errorf("ParseRecord(%q) = %+v, want %+v", tc.record, got, tc.want)
			}
		})
	}
}

func TestRecordEncodeLeavesEmptyFieldsOutAndTheLabelLast(t *testing.T) {
	cases := []struct {
		rec  Record
		want string
	}{
		{Record{}, ""},
		{Record{Caller: "chat-api"}, ";caller=chat-api"},
		{Record{Plan: "free", Label: "m;x=y"}, ";plan=free;label=m;x=y"},
		{Record{Caller: "c", Plan: "p", Label: "l"}, ";caller=c;plan=p;label=l"},
		{Record{Caller: "c", Plan: "p", Pools: "model=m/x", User: "u;1", Label: "l"}, ";caller=c;plan=p;pools=model=m/x;user=3:u;1;label=l"},
		{Record{Caller: "c", Plan: "p", Token: "t0k"}, ";caller=c;by=0@t0k;plan=p"},
		{Record{Plan: "p", Token: "t0k"}, ";by=0@t0k;plan=p"},
	}
	for _, tc := range cases {
		got := tc.rec.encode()
		if got != tc.want {
			t.Errorf("%+v.encode() = %q, want %q", tc.rec, got, tc.want)
		}
		want := tc.rec
		want.Token = "" // the scripts' alone
		if back := ParseRecord("100;started=1" + got); back.Record != want || back.Again != 0 {
			t.Errorf("%+v read back as %+v", tc.rec, back)
		}
	}
}

func TestTokensAreUnlikeAndOfTheCharactersTheScriptsRead(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := NewToken()
		if len(tok) != 11 || strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
			t.Fatalf("NewToken() = %q; want 11 characters of [A-Za-z0-9_-]", tok)
		}
		if seen[tok] {
			t.Fatalf("NewToken() gave %q twice in 1000", tok)
		}
		seen[tok] = true
	}
}

func TestPoolsReadBackAsWritten(t *testing.T) {
	in := []PoolKey{{"model", "meta-llama/Llama-3.1-70B-Instruct"}, {"org", "acme:eu@1"}}
	enc := EncodePools(in)
	if enc != "model=meta-llama/Llama-3.1-70B-Instruct,org=acme:eu@1" {
		t.Errorf("EncodePools = %q", enc)
	}
	if got := DecodePools(enc); len(got) != 2 || got[0] != in[0] || got[1] != in[1] {
		t.Errorf("DecodePools(%q) = %v, want %v", enc, got, in)
	}
	if got := DecodePools(""); got != nil {
		t.Errorf("DecodePools(\"\") = %v, want none", got)
	}
}
