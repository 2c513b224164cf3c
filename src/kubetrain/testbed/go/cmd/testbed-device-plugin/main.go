// Command testbed-device-plugin advertises GPUs that are not there, on the kubelet's
// device-plugin API (v1beta1), for the real-node testbed.
//
// The kubelet counts and allocates the devices as it would real ones, so
// scheduling, the device manager's admission and its errors are real. Allocate
// sets NVIDIA_VISIBLE_DEVICES as NVIDIA's plugin does, but mounts no device node
// and no driver: inside the container there is no GPU, and kubetrain's preflight
// says so. Nothing here pretends otherwise.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once; the devices never change health.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		log.Printf("allocate %s", strings.Join(c.DevicesIDs, ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIDs, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource to advertise")
	count := flag.Int("count", 2, "number of devices")
	prefix := flag.String("id-prefix", "testbed-gpu", "device ids are PREFIX-0, PREFIX-1, ...")
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	var devices []*pluginapi.Device
	for i := 0; i < *count; i++ {
		devices = append(devices, &pluginapi.Device{ID: fmt.Sprintf("%s-%d", *prefix, i), Health: pluginapi.Healthy})
	}
	name := strings.NewReplacer("/", "-", ".", "-").Replace(*resource) + ".sock"
	socket := filepath.Join(*dir, name)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	for {
		p := &plugin{devices: devices, stop: make(chan struct{})}
		server, err := serve(p, socket)
		if err == nil {
			err = register(filepath.Join(*dir, filepath.Base(pluginapi.KubeletSocket)), name, *resource)
		}
		if err != nil {
			log.Printf("not registered yet: %v", err)
		} else {
			log.Printf("registered %d %s at %s", *count, *resource, socket)
		}
		// A restarted kubelet empties its device-plugin directory: the socket going
		// away is the signal to serve and register again.
		for err == nil && exists(socket) {
			select {
			case sig := <-signals:
				log.Printf("stopping on %v", sig)
				close(p.stop)
				server.Stop()
				_ = os.Remove(socket)
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		close(p.stop)
		if server != nil {
			server.Stop()
		}
		select {
		case <-signals:
			_ = os.Remove(socket)
			return
		case <-time.After(time.Second):
		}
	}
}

func serve(p *plugin, socket string) (*grpc.Server, error) {
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	return server, nil
}

func register(kubeletSocket, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
