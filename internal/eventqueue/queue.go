// Package eventqueue records Kubernetes core/v1 Events in the background:
// Eventf never blocks its caller on the API server, and a bounded queue
// drops what it cannot write. The device plugin and the extender share it.
package eventqueue

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// MessageMaxLength is the longest message recorded; longer ones are cut
// (the API server refuses events with longer messages).
const MessageMaxLength = 1024

// CreateFunc creates event in event.Namespace.
type CreateFunc func(ctx context.Context, event *corev1.Event) error

// Queue turns each Eventf into one new core/v1 Event on the object,
// written by Run, so that Eventf never blocks. Unlike client-go's
// recorders it does not fold repeats into one Event with a count, and so
// needs neither strategic merge patches nor their OpenAPI models, nor a
// goroutine per event: callers record events that do not repeat (a
// placement, a registration) or that the kubelet retries with back-off.
// While the queue is full, further events are dropped and logged. Safe for
// concurrent use.
type Queue struct {
	create CreateFunc
	source corev1.EventSource
	clock  clock.PassiveClock
	logger klog.Logger
	queue  chan *corev1.Event
}

// New returns a queue of size events that writes through create.
func New(create CreateFunc, source corev1.EventSource, clk clock.PassiveClock, logger klog.Logger, size int) *Queue {
	return &Queue{create: create, source: source, clock: clk, logger: logger, queue: make(chan *corev1.Event, size)}
}

// Waiting returns how many events wait to be written.
func (q *Queue) Waiting() int { return len(q.queue) }

// Run writes the queued events until ctx ends; events still queued then
// are not written.
func (q *Queue) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-q.queue:
			if err := q.create(ctx, ev); err != nil && ctx.Err() == nil {
				q.logger.Error(err, "Could not record an event", "object", klog.KRef(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), "reason", ev.Reason)
			}
		}
	}
}

// Eventf records an event on a *corev1.Pod or a *corev1.ObjectReference
// (a reference without a namespace, such as a Node's, is recorded in the
// default namespace); other objects are logged and not recorded. It has
// the signature of client-go's record.EventRecorder.Eventf, so that tests
// can use record.FakeRecorder.
func (q *Queue) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	ref, ok := objectReference(object)
	if !ok {
		q.logger.Info("Event not recorded: unsupported object", "type", fmt.Sprintf("%T", object), "reason", reason)
		return
	}
	message := fmt.Sprintf(messageFmt, args...)
	if len(message) > MessageMaxLength {
		message = message[:MessageMaxLength-3] + "..."
	}
	now := metav1.NewTime(q.clock.Now())
	namespace := ref.Namespace
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: namespace},
		InvolvedObject: ref,
		Reason:         reason,
		Message:        message,
		Type:           eventtype,
		Source:         q.source,
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	select {
	case q.queue <- ev:
	default:
		q.logger.Info("Event dropped: too many waiting to be written", "object", klog.KRef(ref.Namespace, ref.Name), "reason", reason, "waiting", cap(q.queue))
	}
}

// objectReference names a pod, or passes a reference on.
func objectReference(object runtime.Object) (corev1.ObjectReference, bool) {
	switch o := object.(type) {
	case *corev1.Pod:
		return corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: o.Namespace, Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion}, true
	case *corev1.ObjectReference:
		return *o, true
	}
	return corev1.ObjectReference{}, false
}
