# The writ image: owners (`node consumers/owner-main.ts`) and the demo records server.
FROM node:24-slim
WORKDIR /app
COPY package.json package-lock.json ./
# npm install, not npm ci: the lock file lacks a Windows-only optional dependency of vite that the registry here does not serve.
RUN npm install --omit=dev --no-audit --no-fund
COPY src ./src
COPY consumers ./consumers
COPY producers ./producers
COPY examples ./examples
COPY schemas ./schemas
USER node
CMD ["node", "consumers/owner-main.ts"]
