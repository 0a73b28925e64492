content of deploy.sh
