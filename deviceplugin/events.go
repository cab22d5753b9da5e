package deviceplugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// eventRecorder records events on pods. It is the Eventf of client-go's
// record.EventRecorder, so that tests can use record.FakeRecorder.
type eventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Bounds of the event writer: events waiting to be written, and the length
// of a message (the API server refuses longer ones).
const (
	eventQueueSize        = 64
	eventMessageMaxLength = 1024
)

// eventWriter is the plugin's eventRecorder: each Eventf becomes one new
// core/v1 Event on the object, written in the background by run, so that
// Eventf never blocks a kubelet call. Unlike client-go's recorder it does
// not fold repeats into one Event with a count, and so needs neither
// strategic merge patches nor their OpenAPI models (a tenth of the
// plugin's code): the plugin records only refused container starts, which
// the kubelet retries with back-off. While eventQueueSize events wait,
// further ones are dropped and logged. Safe for concurrent use.
type eventWriter struct {
	api    API
	source corev1.EventSource
	clock  clock.Clock
	logger klog.Logger
	queue  chan *corev1.Event
}

func newEventWriter(api API, source corev1.EventSource, clk clock.Clock, logger klog.Logger) *eventWriter {
	return &eventWriter{api: api, source: source, clock: clk, logger: logger, queue: make(chan *corev1.Event, eventQueueSize)}
}

// run writes the queued events until ctx ends; events still queued then
// are not written.
func (w *eventWriter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.queue:
			if _, err := w.api.CreateEvent(ctx, ev); err != nil && ctx.Err() == nil {
				w.logger.Error(err, "Could not record an event", "object", klog.KRef(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), "reason", ev.Reason)
			}
		}
	}
}

// Eventf implements eventRecorder for a *corev1.Pod or a
// *corev1.ObjectReference; other objects are logged and not recorded.
func (w *eventWriter) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	ref, ok := objectReference(object)
	if !ok {
		w.logger.Info("Event not recorded: unsupported object", "type", fmt.Sprintf("%T", object), "reason", reason)
		return
	}
	message := fmt.Sprintf(messageFmt, args...)
	if len(message) > eventMessageMaxLength {
		message = message[:eventMessageMaxLength-3] + "..."
	}
	now := metav1.NewTime(w.clock.Now())
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
		Source:         w.source,
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	select {
	case w.queue <- ev:
	default:
		w.logger.Info("Event dropped: too many waiting to be written", "object", klog.KRef(ref.Namespace, ref.Name), "reason", reason, "waiting", eventQueueSize)
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
