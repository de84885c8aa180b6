package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// adminClient calls the admin API with a bearer token.
type adminClient struct {
	base  string
	token string
	http  *http.Client
}

func newAdminClient(base, token string, timeout time.Duration) *adminClient {
	return &adminClient{base: base, token: token, http: &http.Client{Timeout: timeout}}
}

// adminError is an error answer of the admin API.
type adminError struct {
	status  int
	code    string
	message string
}

func (e *adminError) Error() string {
	return fmt.Sprintf("the admin API answered %d %s: %s", e.status, e.code, e.message)
}

// do sends body (JSON, none when nil) and decodes a 200 answer into out.
func (c *adminClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("calling the admin API: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the admin API's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e httpapi.ErrorResponse
		if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
			if resp.StatusCode == http.StatusNotFound {
				return &adminError{status: resp.StatusCode, code: "not_found", message: "no admin API at " + c.base + " (is admin.tokensFile set on the server?)"}
			}
			return &adminError{status: resp.StatusCode, code: "http_error", message: http.StatusText(resp.StatusCode)}
		}
		if e.Error.Code == httpapi.CodeNotFound {
			e.Error.Message += " (is admin.tokensFile set on the server?)"
		}
		return &adminError{status: resp.StatusCode, code: e.Error.Code, message: e.Error.Message}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding the admin API's answer: %w", err)
	}
	return nil
}
