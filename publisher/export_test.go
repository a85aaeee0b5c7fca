package publisher

// Unconfirmed is how many publishes await their confirm on p's first shared
// channel.
func Unconfirmed(p *Publisher) int {
	set := p.channels.Load()
	if len(set.channels) == 0 {
		return 0
	}
	cc := set.channels[0]
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return len(cc.pending)
}

// SuspectRounds is how many confirm round trips p has spent, one after
// another, finding which message caused a channel exception that the
// broker's text pins on none.
func SuspectRounds(p *Publisher) int { return int(p.suspectRounds.Load()) }

// Searching is how many such searches are under way.
func Searching(p *Publisher) int { return int(p.searching.Load()) }
