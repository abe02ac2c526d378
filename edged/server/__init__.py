"""The daemon's ZeroMQ side: the request socket (`router`), the loop's replies to clients
(`replies`), the event socket (`events`), and where every socket is built (`sockets`)."""
