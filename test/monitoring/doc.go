// Package monitoring is the chart's monitoring as a Prometheus runs it, for the tests that query it
// and for the local cluster's Prometheus: the objects the chart renders with its ServiceMonitors,
// PrometheusRule and Grafana dashboard on (Parse), the Prometheus configuration those
// ServiceMonitors imply for pods that Kubernetes service discovery would report (Config), and the
// Prometheus installation of make prometheus (FindInstall; promtool's check rules and test rules).
//
// Config does what the Prometheus Operator does with a ServiceMonitor (one scrape job per
// endpoint, the Operator's relabelings, then the endpoint's own), over static targets that carry
// the meta labels of Kubernetes service discovery's endpoints role instead of discovering them:
// the local cluster runs its components as processes, not pods, so there is nothing to discover.
// The ServiceMonitors' selectors, port names and relabelings are still applied by Prometheus
// itself, so a Service the selector misses, or a relabeling that names the wrong meta label,
// leaves a dropped target or a missing label, as it would on a cluster.
package monitoring
