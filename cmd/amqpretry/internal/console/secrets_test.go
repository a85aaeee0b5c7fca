package console

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// secretUser creates a broker user whose password is easy to spot, and
// removes it when the test ends.
func secretUser(t *testing.T) (user, password string) {
	t.Helper()
	brokertest.Dial(t)
	user, password = brokertest.Name(t, "user"), "Pw-7c1e9b-never-shown"
	brokertest.Rabbitmqctl(t, "add_user", user, password)
	t.Cleanup(func() { _, _ = brokertest.Ctl("delete_user", user) })
	brokertest.Rabbitmqctl(t, "set_permissions", user, ".*", ".*", ".*")
	return user, password
}

// The broker's password reaches no page, no log line and no audit line:
// not the footer, not a failed look, not a failed replay, not a refused
// login.
func TestPasswordsNeverShown(t *testing.T) {
	user, password := secretUser(t)
	topo := topology(t)
	fill(t, topo, threeKinds)
	missing := brokertest.Name(t, "missing")
	s := serve(t, Config{URLs: []string{brokertest.WithCredentials(user, password)}, Queues: []string{topo.DLQ(), missing}})
	c := s.signIn(t)
	var pages []string
	_, overview := c.get("/")
	pages = append(pages, overview)
	if !strings.Contains(overview, "NOT_FOUND") || !strings.Contains(overview, user+":xxxxx@") {
		t.Errorf("the overview shows neither the missing queue's error nor the redacted URL:\n%s", overview)
	}
	// A replay to a queue that is not there: unroutable, refused.
	_, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:tax-0"}, "op": {"replay-selected"}, "to": {"queue"}, "to_queue": {missing}})
	pages = append(pages, body)
	if !strings.Contains(body, "replayed 0, 1 left") {
		t.Errorf("a replay to a missing queue:\n%s", body)
	}
	// A console whose password is wrong.
	wrong := serve(t, Config{URLs: []string{brokertest.WithCredentials(user, password+"-wrong")}, Queues: []string{topo.DLQ()}})
	_, body = wrong.signIn(t).get("/")
	pages = append(pages, body)
	if !strings.Contains(body, "ACCESS_REFUSED") && !strings.Contains(body, "403") {
		t.Errorf("a refused login is not on the page:\n%s", body)
	}
	for i, text := range append(pages, s.log.String(), s.audit.String(), wrong.log.String()) {
		if strings.Contains(text, password) || strings.Contains(text, url.QueryEscape(password)) {
			t.Errorf("text %d shows the password:\n%s", i, text)
		}
	}
	if !strings.Contains(s.audit.String(), `"outcome":"failed"`) {
		t.Errorf("audit: %s", s.audit.String())
	}
}

// --queues-matching lists queues through the management API, with the AMQP
// URL's credentials, and shows those that match; the API's password is in
// no error.
func TestQueuesMatching(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds[:1])
	var gotUser, gotPassword, gotPath string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotUser, gotPassword, _ = r.BasicAuth()
		gotPath = r.URL.EscapedPath() + "?" + r.URL.RawQuery
		_ = json.NewEncoder(w).Encode([]map[string]any{{"name": topo.Queue}, {"name": topo.DLQ()}, {"name": "other.dlq"}})
	}))
	defer api.Close()
	amqpURL := brokertest.URL()
	s := serve(t, Config{URLs: []string{amqpURL}, QueuesMatching: regexp.MustCompile(regexp.QuoteMeta(topo.Queue) + `\.dlq$`), ManagementURL: api.URL})
	c := s.signIn(t)
	_, body := c.get("/")
	if !strings.Contains(body, "<h2>"+topo.DLQ()+"</h2>") || strings.Contains(body, "<h2>other.dlq</h2>") || strings.Contains(body, "<h2>"+topo.Queue+"</h2>") {
		t.Errorf("the overview shows the wrong queues:\n%s", body)
	}
	if counts, _ := overviewGroups(t, body); counts["customer &lt;n&gt; not found"] != 5 {
		t.Errorf("groups %v", counts)
	}
	if gotUser != "guest" || gotPassword != "guest" || gotPath != "/api/queues/%2F?columns=name" {
		t.Errorf("the management API was asked %s as %s:%s", gotPath, gotUser, gotPassword)
	}
	// A queue the pattern does not match is not the console's to act on.
	if resp, _ := c.post("/purge", url.Values{"q": {"other.dlq"}, "name": {"other.dlq"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("purge of a queue not shown: %s", resp.Status)
	}

	// An API that refuses: the page says so, without the password.
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not authorised", http.StatusUnauthorized)
	}))
	defer refusing.Close()
	u, _ := url.Parse(refusing.URL)
	u.User = url.UserPassword("admin", "Mgmt-0a9f-secret")
	s = serve(t, Config{QueuesMatching: regexp.MustCompile(`\.dlq$`), ManagementURL: u.String()})
	_, body = s.signIn(t).get("/")
	if !strings.Contains(body, "401 Unauthorized") || strings.Contains(body, "Mgmt-0a9f-secret") || strings.Contains(s.log.String(), "Mgmt-0a9f-secret") {
		t.Errorf("a refusing management API:\n%s", body)
	}
}
