package extender

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/vgpu"
)

// EventGPUsAssigned is the reason of the pod event Bind records for each
// placement.
const EventGPUsAssigned = "GPUsAssigned"

// eventQueueSize is how many events may wait for the API server; beyond
// that Eventf drops them (a burst of binds outruns Options.EventClient's
// rate), so that events never hold binds back.
const eventQueueSize = 4096

// eventCreator writes events through client.
func eventCreator(client kubernetes.Interface) func(ctx context.Context, ev *corev1.Event) error {
	return func(ctx context.Context, ev *corev1.Event) error {
		_, err := client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{FieldManager: fieldManager})
		return err
	}
}

// placementMessage says what a pod was given, e.g.
// "GPUs assigned: GPU-0a…(A100-SXM4-80GB) 10240 MiB, 30%"; a pod with
// several GPU containers has one "container: …" part per container, and a
// container with several GPUs one slice per GPU. models gives each GPU's
// model by UUID ("NVIDIA " is left out); an unknown model is left out.
func placementMessage(alloc vgpu.PodAllocation, models map[string]string) string {
	var b strings.Builder
	b.WriteString("GPUs assigned:")
	for i, c := range alloc.Containers {
		if i > 0 {
			b.WriteString(";")
		}
		if len(alloc.Containers) > 1 {
			fmt.Fprintf(&b, " %s:", c.Name)
		}
		for j, g := range c.GPUs {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString(" " + g.UUID)
			if m := strings.TrimPrefix(models[g.UUID], "NVIDIA "); m != "" {
				b.WriteString("(" + m + ")")
			}
			fmt.Fprintf(&b, " %d MiB, %d%%", g.MemoryMiB, g.CoresPercent)
		}
	}
	return b.String()
}
