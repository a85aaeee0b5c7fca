package brokertest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMissingBroker runs itself in a child process pointed at a port where
// nothing listens; in the child it only dials.
func TestMissingBroker(t *testing.T) {
	if os.Getenv("BROKERTEST_CHILD") == "1" {
		brokertest.Dial(t)
		return
	}
	tests := []struct {
		name    string
		require string
		wantErr bool
		want    string
	}{
		{"fails under make test", "1", true, "--- FAIL: TestMissingBroker"},
		{"skips elsewhere", "", false, "--- SKIP: TestMissingBroker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMissingBroker$", "-test.v")
			cmd.Env = append(os.Environ(),
				"BROKERTEST_CHILD=1",
				"AMQP_URL=amqp://guest:guest@127.0.0.1:1/", // nothing listens on port 1
				brokertest.RequireEnv+"="+tt.require,
			)
			out, err := cmd.CombinedOutput()
			if (err != nil) != tt.wantErr || !strings.Contains(string(out), tt.want) {
				t.Fatalf("err = %v, want error %v; output:\n%s", err, tt.wantErr, out)
			}
			if !strings.Contains(string(out), "scripts/broker.sh") || strings.Contains(string(out), "guest:guest") {
				t.Errorf("the message must point to scripts/broker.sh and hide the password:\n%s", out)
			}
		})
	}
}

func TestDialRealBroker(t *testing.T) {
	conn := brokertest.Dial(t)
	ch := brokertest.Channel(t, conn)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
		t.Fatalf("queue %s not declared: %v", q, err)
	}
}
