package retry

import "time"

// Figures are the count and longest wait of some waiting pods.
type Figures struct {
	Count int
	// Oldest is the longest time since Filter first turned one of them
	// away; 0 when the Tracker is untimed (New's now nil) or none waits.
	Oldest time.Duration
}

// Pending returns the waiting pods' figures at now, by the most hopeful
// class of what turned each away (Rejection.Class). Safe to call at any
// time, such as a metrics scrape.
func (t *Tracker[D]) Pending(now time.Time) [Classes]Figures {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out [Classes]Figures
	for _, w := range t.waiting {
		f := &out[w.rej.Class()]
		f.Count++
		if !w.since.IsZero() {
			f.Oldest = max(f.Oldest, now.Sub(w.since))
		}
	}
	return out
}
