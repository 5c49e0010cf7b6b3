#!/usr/bin/perl
# An HTTP/1.1 keep-alive server whose replies are the ones the request
# sensor must follow or give up on (bpf/replies.h): by path, "/continue"
# a 100 Continue and then a 200 (two writes), "/notmod" a 304 with a
# Content-Length and no body, "/chunked" a chunked 200, else a 200 with a
# Content-Length. One connection at a time, on 127.0.0.1:PORT; gone after
# 60 s. Usage: replies.pl PORT
use strict;
use warnings;
use IO::Socket::INET;

my $port = shift or die "usage: replies.pl PORT\n";
my $l = IO::Socket::INET->new(
    Listen => 8, LocalAddr => "127.0.0.1:$port", ReuseAddr => 1) or die "listen: $!\n";
alarm 60;
my %reply = (
    '/continue' => ["HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    '/notmod' => ["HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n"],
    '/chunked' => ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"],
);
my $ok = ["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"];
while (my $c = $l->accept) {
    my $buf = '';
    CONN: while (1) {
        while ($buf !~ /\r\n\r\n/) {
            my $n = sysread($c, $buf, 4096, length $buf);
            last CONN unless $n;
        }
        $buf =~ s/^(.*?)\r\n\r\n//s;
        my ($path) = $1 =~ /^\S+ (\S+)/;
        syswrite($c, $_) for @{ $reply{$path} // $ok };
    }
    close $c;
}
