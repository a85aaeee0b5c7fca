package testlog_test

import (
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBufferKeepsConcurrentWrites(t *testing.T) {
	var b testlog.Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				b.Logger().Info("hello", "k", "v")
			}
		}()
	}
	wg.Wait()
	if n := b.Count("msg=hello"); n != 800 {
		t.Fatalf("Count = %d, want 800", n)
	}
}
