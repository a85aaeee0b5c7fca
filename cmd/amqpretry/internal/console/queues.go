package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
)

// queueLister lists a vhost's queues through RabbitMQ's management API
// (GET /api/queues/VHOST): AMQP 0.9.1 cannot list queues.
type queueLister struct {
	base           *url.URL // without user info
	vhost          string
	user, password string
	client         *http.Client
}

// newQueueLister reaches the management API at managementURL, or where the
// AMQP URL amqpURL suggests: the same host, port 15672 (15671 for amqps://),
// the same user and vhost.
func newQueueLister(managementURL, amqpURL string) (*queueLister, error) {
	uri, err := amqpurl.Parse(amqpURL)
	if err != nil {
		return nil, err
	}
	l := &queueLister{vhost: uri.Vhost, user: uri.Username, password: uri.Password, client: &http.Client{Timeout: 10 * time.Second}}
	if l.vhost == "" {
		l.vhost = "/"
	}
	if managementURL == "" {
		scheme, port := "http", 15672
		if uri.Scheme == "amqps" {
			scheme, port = "https", 15671
		}
		managementURL = scheme + "://" + net.JoinHostPort(uri.Host, strconv.Itoa(port)) + "/"
	}
	base, err := url.Parse(managementURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("management URL %q: want http://host:15672/ or an https:// URL", amqpurl.Redact(managementURL))
	}
	if base.User != nil {
		l.user = base.User.Username()
		l.password, _ = base.User.Password()
		base.User = nil
	}
	l.base = base
	return l, nil
}

// list returns the names of the vhost's queues.
func (l *queueLister) list(ctx context.Context) ([]string, error) {
	// The vhost is one path segment: "/" is %2F.
	u := strings.TrimSuffix(l.base.String(), "/") + "/api/queues/" + url.PathEscape(l.vhost) + "?columns=name"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(l.user, l.password)
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("list queues through the management API at %s: %w", l.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list queues through the management API at %s: %s (is the rabbitmq_management plugin on, and may user %q read the vhost?)",
			l.base, resp.Status, l.user)
	}
	var queues []struct {
		Name string `json:"name"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&queues); err != nil {
		return nil, fmt.Errorf("list queues through the management API at %s: %w", l.base, err)
	}
	names := make([]string, len(queues))
	for i, q := range queues {
		names[i] = q.Name
	}
	return names, nil
}
