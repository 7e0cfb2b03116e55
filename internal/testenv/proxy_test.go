package testenv

import (
	"bufio"
	"net"
	"testing"
	"time"
)

func TestProxyForwardsCutsAndStalls(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				s := bufio.NewScanner(c)
				for s.Scan() {
					c.Write(append(s.Bytes(), '\n'))
				}
				c.Close()
			}()
		}
	}()
	p, err := StartProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	roundTrip := func(msg string, d time.Duration) error {
		c.SetDeadline(time.Now().Add(d))
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return err
		}
		_, err := r.ReadString('\n')
		return err
	}
	if err := roundTrip("hello", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if err := roundTrip("stalled", 200*time.Millisecond); err == nil {
		t.Fatal("a stalled proxy answered")
	}
	p.Resume()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("bytes sent during the stall were lost: %v", err)
	}
	p.Cut()
	if err := roundTrip("cut", 2*time.Second); err == nil {
		t.Fatal("a cut connection still works")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c, r = c2, bufio.NewReader(c2)
	if err := roundTrip("again", 2*time.Second); err != nil {
		t.Fatalf("new connection after a cut: %v", err)
	}
}
