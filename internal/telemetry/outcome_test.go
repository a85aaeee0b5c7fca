package telemetry

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// Every outcome has a name of its own, and its attributes say it.
func TestOutcomesAreNamed(t *testing.T) {
	seen := map[string]Outcome{}
	for o := range numOutcomes {
		name := o.String()
		if name == "" {
			t.Errorf("outcome %d has no name", o)
		}
		if prev, dup := seen[name]; dup {
			t.Errorf("outcomes %d and %d are both %q", prev, o, name)
		}
		seen[name] = o
		if a := o.Attr(); string(a.Key) != KeyOutcome || a.Value.AsString() != name {
			t.Errorf("outcome %q has the attribute %v", name, a)
		}
	}
	q := New(Config{}).ForQueue("orders")
	for o := range numOutcomes {
		set := q.Outcome(o).Set
		dest, _ := set.Value(attribute.Key(KeyDestinationName))
		outcome, _ := set.Value(attribute.Key(KeyOutcome))
		if set.Len() != 2 || dest.AsString() != "orders" || outcome.AsString() != o.String() {
			t.Errorf("the metric attributes of %q on orders are %v", o, set)
		}
	}
}
