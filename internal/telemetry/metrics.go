package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Attrs is an attribute set with the metric options that carry it, ready to
// pass to Add and Record without allocating.
type Attrs struct {
	Set    attribute.Set
	Add    []metric.AddOption
	Record []metric.RecordOption
}

// Attrs returns the cached Attrs of up to four string key-value pairs.
func (m *Metrics) Attrs(kv ...string) *Attrs {
	var key setKey
	copy(key[:], kv) // more than four pairs is a programming error
	m.mu.RLock()
	a, ok := m.sets[key]
	m.mu.RUnlock()
	if ok {
		return a
	}
	list := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		list = append(list, attribute.String(kv[i], kv[i+1]))
	}
	set := attribute.NewSet(list...)
	opt := metric.WithAttributeSet(set)
	a = &Attrs{Set: set, Add: []metric.AddOption{opt}, Record: []metric.RecordOption{opt}}
	m.mu.Lock()
	m.sets[key] = a
	m.mu.Unlock()
	return a
}

type setKey [8]string

// Messaging returns the cached Attrs of a messaging metric: messaging.system
// rabbitmq, the operation and the destination, and error.type unless
// errorType is "".
func (m *Metrics) Messaging(operation, destination, errorType string) *Attrs {
	if errorType == "" {
		return m.Attrs(KeyMessagingSystem, SystemRabbitMQ, KeyOperationName, operation, KeyDestinationName, destination)
	}
	return m.Attrs(KeyMessagingSystem, SystemRabbitMQ, KeyOperationName, operation, KeyDestinationName, destination, KeyErrorType, errorType)
}

// QueueAttrs holds, for one queue, the Attrs of the queue alone and of every
// outcome on it, so that a delivery looks them up once.
type QueueAttrs struct {
	name     string
	Queue    *Attrs // messaging.destination.name only
	outcomes [numOutcomes]*Attrs
}

// Outcome returns the Attrs of an outcome on the queue.
func (q *QueueAttrs) Outcome(o Outcome) *Attrs { return q.outcomes[o] }

// ForQueue returns the cached QueueAttrs of queue.
func (m *Metrics) ForQueue(queue string) *QueueAttrs {
	if last := m.lastQueue.Load(); last != nil && last.name == queue {
		return last // a listener asks for the same queue every time
	}
	q := m.forQueue(queue)
	m.lastQueue.Store(q)
	return q
}

func (m *Metrics) forQueue(queue string) *QueueAttrs {
	m.mu.RLock()
	q, ok := m.queues[queue]
	m.mu.RUnlock()
	if ok {
		return q
	}
	q = &QueueAttrs{name: queue, Queue: m.Attrs(KeyDestinationName, queue)}
	for o, name := range outcomeNames {
		q.outcomes[o] = m.Attrs(KeyDestinationName, queue, KeyOutcome, name)
	}
	m.mu.Lock()
	m.queues[queue] = q
	m.mu.Unlock()
	return q
}
