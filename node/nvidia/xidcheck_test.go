package nvidia

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCheckXIDEvents(t *testing.T) {
	f, err := NewFake("2xA100-80GB,1xT4-16GB", testNode)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetEventsUnsupported(1, true); err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Library: f})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.CheckXIDEvents(10 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	want := []XIDSupport{
		{UUID: FakeUUID(testNode, 0), Index: 0, Registered: true},
		{UUID: FakeUUID(testNode, 1), Index: 1, Reason: "ERROR_NOT_SUPPORTED"},
		{UUID: FakeUUID(testNode, 2), Index: 2, Registered: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CheckXIDEvents (-want +got):\n%s", diff)
	}
	if f.Watched(0) {
		t.Error("GPU 0 still watched after the check freed its event set")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CheckXIDEvents(time.Millisecond); !errors.Is(err, ErrClosed) {
		t.Errorf("CheckXIDEvents after Close = %v, want ErrClosed", err)
	}
}
