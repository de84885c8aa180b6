package server

import (
	"strings"
	"testing"
)

const (
	carolToken = "carol-token-0123456789abcdef"
	daveToken  = "dave-token-0123456789abcdef"
)

func TestParseCallers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string
		want    []string // name/token?/plans of each caller, in order
		wantErr string
	}{
		{
			name: "lines of name token plans, with comments, blank lines, tabs and CRLF",
			file: "# callers\n\ncarol " + carolToken + " free,paid\r\n\tdave\t" + daveToken + "\t*  \n  # indented\nedge.example.com - paid\n",
			want: []string{"carol/token/free,paid", "dave/token/*", "edge.example.com/-/paid"},
		},
		{name: "an empty file holds no caller", file: "", want: nil},
		{name: "repeated plans are kept once", file: "carol " + carolToken + " paid,free,paid\n", want: []string{"carol/token/free,paid"}},
		{name: "two fields name the line", file: "# c\ncarol " + carolToken + "\n", wantErr: `line 2: want 3 fields "name token plans", got 2`},
		{name: "four fields name the line", file: "carol " + carolToken + " free extra\n", wantErr: "line 1: want 3 fields"},
		{name: "a short token", file: "carol short free\n", wantErr: `line 1: the token (field 2) is 5 characters, want 16 to 4096 (or "-" for a caller with a client certificate only)`},
		{name: "columns swapped: the token is not echoed", file: "carol free " + carolToken + "\n", wantErr: "line 1: the token (field 2) is 4 characters"},
		{name: "an empty plan in the list", file: "carol " + carolToken + " free,,paid\n", wantErr: `line 1: the plans (field 3) must be "*" or a comma-separated list`},
		{name: "* among plans", file: "carol " + carolToken + " free,*\n", wantErr: "line 1: the plans (field 3) must be"},
		{name: "a token in the plans column is not echoed", file: "carol " + carolToken + " " + daveToken + "!\n", wantErr: "line 1: the plans (field 3) must be"},
		{name: "a bad name", file: "car/ol " + carolToken + " free\n", wantErr: "line 1: the name (field 1) must be 1-253 characters"},
		{name: "a duplicate name", file: "carol " + carolToken + " free\ncarol " + daveToken + " paid\n", wantErr: "line 2: the name (field 1) is already used on line 1"},
		{name: "a duplicate token", file: "carol " + carolToken + " free\ndave " + carolToken + " paid\n", wantErr: "line 2: the token (field 2) is already used on line 1"},
		{name: "two certificate-only callers are not duplicate tokens", file: "a.example - free\nb.example - paid\n", want: []string{"a.example/-/free", "b.example/-/paid"}},
		{name: "invalid UTF-8", file: "carol \xff" + carolToken + " free\n", wantErr: "line 1: not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := parseCallers(strings.NewReader(tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error: got %v, want it to contain %q", err, tc.wantErr)
				}
				for _, secret := range []string{carolToken, daveToken, "short"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("error %q echoes a token", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("error: got %v, want none", err)
			}
			var got []string
			for _, c := range set.callers {
				token, plans := "-", strings.Join(c.plans, ",")
				if c.hasToken {
					token = "token"
				}
				if c.anyPlan {
					plans = "*"
				}
				got = append(got, c.name+"/"+token+"/"+plans)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("callers: got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCallerLookup(t *testing.T) {
	set, err := parseCallers(strings.NewReader("carol " + carolToken + " free,paid\ndave " + daveToken + " *\nedge.example.com - paid\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		presented string
		want      string
	}{
		{"carol's token is carol", carolToken, "carol"},
		{"dave's token is dave", daveToken, "dave"},
		{"a prefix of a token is unknown", carolToken[:20], ""},
		{"a token with a suffix is unknown", carolToken + "x", ""},
		{"the certificate-only marker is no token", "-", ""},
		{"an empty token is unknown", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := set.byToken(tc.presented)
			if c.name != tc.want {
				t.Errorf("byToken: got %q, want %q", c.name, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		caller, plan string
		want         bool
	}{
		{"carol", "free", true},
		{"carol", "paid", true},
		{"carol", "enterprise", false},
		{"carol", "", false},
		{"dave", "enterprise", true},
		{"edge.example.com", "paid", true},
		{"edge.example.com", "free", false},
	} {
		c, ok := set.byName(tc.caller)
		if !ok {
			t.Fatalf("byName(%q): not found", tc.caller)
		}
		if got := c.allows(tc.plan); got != tc.want {
			t.Errorf("%s allows %q: got %v, want %v", tc.caller, tc.plan, got, tc.want)
		}
	}
	if _, ok := set.byName("mallory"); ok {
		t.Errorf("byName(mallory): found, want unknown")
	}
	if (caller{}).allows("free") {
		t.Errorf("the zero caller allows a plan, want none")
	}
}
