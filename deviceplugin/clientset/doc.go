// Package clientset adapts a client-go clientset to deviceplugin.API: for
// tests, over client-go's fake clientset, and for programs that hold a
// clientset anyway. The plugin's own binary uses deviceplugin.NewAPI
// instead, which does not link the clientset and its scheme of every
// built-in API group.
package clientset
