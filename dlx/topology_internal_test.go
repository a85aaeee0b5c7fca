package dlx

import (
	"math"
	"reflect"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The DLQ's arguments, as Declare sends them before the queue type: a quorum
// DLQ gets a delivery limit RabbitMQ 4's default of 20 cannot undercut, unless
// the user names one or asks for the broker's.
func TestDLQArguments(t *testing.T) {
	tests := []struct {
		name string
		topo Topology
		want amqp.Table
	}{
		{"classic", Topology{Queue: "q", DLQArguments: amqp.Table{"x-max-length": int64(10)}}, amqp.Table{"x-max-length": int64(10)}},
		{"quorum", Topology{Queue: "q", Type: Quorum}, amqp.Table{"x-delivery-limit": int64(math.MaxInt32)}},
		{"quorum, DeliveryLimit is the work queue's", Topology{Queue: "q", Type: Quorum, DeliveryLimit: 3},
			amqp.Table{"x-delivery-limit": int64(math.MaxInt32)}},
		{"quorum, the user's limit wins", Topology{Queue: "q", Type: Quorum, DLQArguments: amqp.Table{"x-delivery-limit": int64(1000)}},
			amqp.Table{"x-delivery-limit": int64(1000)}},
		{"quorum, DLQWithBrokerDefaultLimit", Topology{Queue: "q", Type: Quorum, DLQWithBrokerDefaultLimit: true,
			DLQArguments: amqp.Table{"x-max-length": int64(10)}}, amqp.Table{"x-max-length": int64(10)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := clone(tt.topo.DLQArguments)
			if got := tt.topo.dlqArguments(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("dlqArguments() = %v, want %v", got, tt.want)
			}
			if !reflect.DeepEqual(clone(tt.topo.DLQArguments), before) {
				t.Errorf("DLQArguments changed to %v", tt.topo.DLQArguments)
			}
		})
	}
}

func clone(t amqp.Table) amqp.Table {
	out := amqp.Table{}
	for k, v := range t {
		out[k] = v
	}
	return out
}
