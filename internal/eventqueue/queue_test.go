package eventqueue

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
)

// Test values: the source component, the event reason and the queue size.
const (
	testComponent = "gpuslice-test"
	testReason    = "TestReason"
	testQueueSize = 8
)

// createIn creates events with client.
func createIn(client *fake.Clientset) CreateFunc {
	return func(ctx context.Context, ev *corev1.Event) error {
		_, err := client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
		return err
	}
}

func TestQueue(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	source := corev1.EventSource{Component: testComponent, Host: "node-1"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", UID: "uid-1", ResourceVersion: "7"}}
	tests := []struct {
		name   string
		object runtime.Object
		format string
		args   []any
		want   *corev1.Event // nil: nothing recorded
	}{{
		name: "pod", object: pod, format: "container %s: %s", args: []any{"main", "no allocation"},
		want: &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("train.%x", now.UnixNano())},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ml", Name: "train", UID: "uid-1", ResourceVersion: "7"},
			Reason:         testReason, Message: "container main: no allocation", Type: corev1.EventTypeWarning,
			Source: source, FirstTimestamp: metav1.NewTime(now), LastTimestamp: metav1.NewTime(now), Count: 1,
		},
	}, {
		name: "reference without namespace", object: &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "gone"}, format: "%s", args: []any{strings.Repeat("x", 2000)},
		want: &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: fmt.Sprintf("gone.%x", now.UnixNano())},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "gone"},
			Reason:         testReason, Message: strings.Repeat("x", MessageMaxLength-3) + "...", Type: corev1.EventTypeWarning,
			Source: source, FirstTimestamp: metav1.NewTime(now), LastTimestamp: metav1.NewTime(now), Count: 1,
		},
	}, {
		name: "unsupported object", object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, format: "x",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			w := New(createIn(client), source, testingclock.NewFakeClock(now), ktesting.NewLogger(t, ktesting.DefaultConfig), testQueueSize)
			w.Eventf(tt.object, corev1.EventTypeWarning, testReason, tt.format, tt.args...)
			if tt.want == nil && w.Waiting() != 0 {
				t.Fatalf("%d events queued, want none", w.Waiting())
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				w.Run(ctx)
			}()
			defer func() { cancel(); <-done }()
			var got []corev1.Event
			err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
				list, err := client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, err
				}
				got = list.Items
				for i := range got { // what the fake API adds
					got[i].TypeMeta, got[i].ManagedFields = metav1.TypeMeta{}, nil
				}
				return len(got) > 0 || tt.want == nil, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var want []corev1.Event
			if tt.want != nil {
				want = []corev1.Event{*tt.want}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestQueueNeverBlocks checks that Eventf drops events beyond the
// queue instead of waiting for the API server.
func TestQueueNeverBlocks(t *testing.T) {
	w := New(createIn(fake.NewClientset()), corev1.EventSource{Component: testComponent}, testingclock.NewFakeClock(time.Now()), ktesting.NewLogger(t, ktesting.DefaultConfig), testQueueSize)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train"}}
	for range testQueueSize + 10 {
		w.Eventf(pod, corev1.EventTypeWarning, testReason, "refused")
	}
	if got := w.Waiting(); got != testQueueSize {
		t.Errorf("%d events waiting, want %d", got, testQueueSize)
	}
}
