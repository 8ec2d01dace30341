"""The clients a role uses to reach the servers: ``peers`` (a server that may go away and come
back), ``replay`` (an actor's link to replay) and ``params`` (an actor's link to the parameter
server, and waiting for weights). The actor and the evaluation actor both import them; neither
imports the other."""
